"""The trainer's profiler, stood in for: times each data fetch, and the other callbacks' hooks between the steps.

Lightning calls `trainer.profiler.start/stop` around every fetch from the training dataloader (also inside a
`dataloader_iter` training step, from every dataloader of a combined loader) and around validation fetches,
and wraps every callback hook in `trainer.profiler.profile("[Callback]<state key>.<hook>")` (the action names:
`trainer/lightning_private.py`). Standing in for the profiler (the user's `SimpleProfiler` or `PyTorchProfiler` as
well as Lightning's do-nothing default) sees both without a callback of our own in the user's list: every call
goes on to the real profiler unchanged.

This is the one instrument of other callbacks' time. Between two steps (from our batch-end hook to our next
batch-start hook, `open_gap` to `close_gap`) `profile` times each outermost callback hook that is not the
profiler's own, and sums them; a hook called inside another (the `on_save_checkpoint` hooks inside
`ModelCheckpoint.on_train_batch_end`) is in its caller's time, never counted twice. Once per log interval the gap
is also split by callback, to name them. During the step `profile` is the real profiler's own method, so the
hooks inside the step (`on_before_backward`, ...) cost what Lightning already pays.

It replaced two marks put first and last in the trainer's callback list, which bounded the same hooks from
outside. Each mark was one more callback for Lightning to dispatch every hook of every batch to (the step's hooks
too, each in a profiled block), so the pair cost as much as two callbacks of the user's; the marks changed the
user's callback list; and the profiler's own work at an interval's end, in our batch-end hook before a last mark,
counted as other callbacks' time. Timing the hooks themselves wraps only the callback hooks in the gap, with a
small class that calls Lightning's `start`/`stop` in place of its generator-based `profile`: measured on
Lightning's own dispatch, a fraction of the marks' cost per batch, and nothing goes into the trainer but this
profiler, which the data wait needs anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from anemoi_profiler.clock.intervals import STAGES
from anemoi_profiler.trainer.lightning_private import CALLBACK_PREFIX, FETCH_ACTIONS, profile_starts_and_stops


class LoopTimer:
    def __init__(self, profiler: Any, now: Callable[[], float] = time.perf_counter) -> None:
        self.wrapped = profiler
        self._now = now
        self.fetch_s = dict.fromkeys(STAGES, 0.0)
        """Seconds fetching per stage, until `BatchGaps` takes them at a batch's end (and zeroes them)."""
        self.fetches = dict.fromkeys(STAGES, 0)
        self._fetch_started = 0.0
        self.profile = profiler.profile
        self.callbacks_s = 0.0
        """Seconds in other callbacks' outermost hooks since `open_gap`."""
        self._own: tuple[str, ...] = ()  # action-name prefixes of the profiler's own callbacks
        self._gap_open = False
        self._depth = 0  # callback hooks being timed, nested (at most 1 but for hooks inside a timed one)
        self._sample: dict[str, float] | None = None
        self._around: tuple[str, Callable[[], AbstractContextManager[Any]]] | None = None
        self._in_gap = self._gap_profile  # bound once: set as `profile` at every batch's end
        self._starts_and_stops = profile_starts_and_stops(profiler)  # so a timed hook calls start/stop itself

    # ---- what Lightning calls ----
    def start(self, action_name: str) -> None:
        if action_name in FETCH_ACTIONS:
            self._fetch_started = self._now()
        self.wrapped.start(action_name)

    def stop(self, action_name: str) -> None:
        self.wrapped.stop(action_name)
        stage = FETCH_ACTIONS.get(action_name)
        if stage is not None:
            self.fetch_s[stage] += self._now() - self._fetch_started
            self.fetches[stage] += 1

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): never recurse
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    # ---- other callbacks' hooks between two steps ----
    def leave_out(self, own_state_keys: frozenset[str]) -> None:
        """The profiler's own callbacks, whose hooks are no other callback's time."""
        self._own = tuple(f"{CALLBACK_PREFIX}{key}." for key in sorted(own_state_keys))

    def open_gap(self, sample: bool) -> None:
        """A step ended: time other callbacks' hooks until `close_gap`; with `sample`, callback by callback."""
        self.callbacks_s = 0.0
        self._gap_open = True
        self._sample = {} if sample else None
        self._choose_profile()

    def close_gap(self) -> tuple[float, dict[str, float] | None]:
        """The next step starts (or the gap is dropped): seconds in other callbacks' hooks since `open_gap`, and
        per callback state key when sampled."""
        seconds, sample = self.callbacks_s, self._sample
        self.callbacks_s, self._sample, self._gap_open = 0.0, None, False
        self._choose_profile()
        return seconds, sample

    def _gap_profile(self, action_name: str) -> AbstractContextManager[Any]:
        if self._depth or not action_name.startswith(CALLBACK_PREFIX) or action_name.startswith(self._own):
            return self.wrapped.profile(action_name)
        return _TimedHook(self, action_name, None if self._starts_and_stops else self.wrapped.profile(action_name))

    # ---- watching one block ----
    def around_next(self, action_name: str, context: Callable[[], AbstractContextManager[Any]]) -> None:
        """Run the next `profile(action_name)` block (say Lightning's `run_training_batch`: the step alone,
        without any callback's hooks) inside `context()`, once."""
        self._around = (action_name, context)
        self._choose_profile()

    def cancel_around(self) -> bool:
        """Drop the block `around_next` waits for; True when there was one (Lightning never ran it)."""
        pending, self._around = self._around, None
        self._choose_profile()
        return pending is not None

    @contextmanager
    def _watching_profile(self, action_name: str) -> Iterator[str]:
        around = self._around
        if around is not None and action_name == around[0]:
            self._around = None
            self._choose_profile()
            with around[1](), self.wrapped.profile(action_name) as name:
                yield name
            return
        block = self._gap_profile(action_name) if self._gap_open else self.wrapped.profile(action_name)
        with block as name:
            yield name

    def _choose_profile(self) -> None:
        """`profile` is the real profiler's own method but in a gap or while a block is watched."""
        if self._around is not None:
            self.profile = self._watching_profile
        elif self._gap_open:
            self.profile = self._in_gap
        else:
            self.profile = self.wrapped.profile


class _TimedHook:
    """One callback hook in the gap, timed around the real profiler's block. A class, not a generator; and where
    that block is Lightning's own `Profiler.profile` (start, then stop), it calls them itself: timing a hook then
    costs about what the block it replaces did."""

    __slots__ = ("_action", "_block", "_started", "_timer")

    def __init__(self, timer: LoopTimer, action: str, block: AbstractContextManager[Any] | None) -> None:
        self._timer, self._action, self._block = timer, action, block
        self._started = 0.0

    def __enter__(self) -> Any:
        timer = self._timer
        timer._depth += 1
        self._started = timer._now()
        if self._block is None:
            timer.wrapped.start(self._action)
            return self._action
        return self._block.__enter__()

    def __exit__(self, *exc_info: Any) -> Any:
        timer = self._timer
        try:
            if self._block is None:
                timer.wrapped.stop(self._action)
                return False
            return self._block.__exit__(*exc_info)
        finally:
            timer._depth -= 1
            seconds = timer._now() - self._started
            if timer._gap_open:
                timer.callbacks_s += seconds
                sample = timer._sample
                if sample is not None:
                    state_key = self._action[len(CALLBACK_PREFIX) :].rsplit(".", 1)[0]
                    sample[state_key] = sample.get(state_key, 0.0) + seconds


def unwrapped(profiler: Any) -> Any:
    """The user's profiler behind a `LoopTimer`."""
    return profiler.wrapped if isinstance(profiler, LoopTimer) else profiler
