"""The trainer's profiler, stood in for: times each data fetch, and once per log interval each callback's hooks.

Lightning calls `trainer.profiler.start/stop` around every fetch from the training dataloader (also inside a
`dataloader_iter` training step, from every dataloader of a combined loader) and around validation fetches,
and wraps every callback hook in `trainer.profiler.profile` (the action names: `trainer/lightning_private.py`).
Standing in for the profiler (the user's `SimpleProfiler` or `PyTorchProfiler` as well as Lightning's
do-nothing default) sees both without a hook of our own: every call goes on to the real profiler unchanged.
`profile` is the real profiler's own method except while a sample is taken or a block is watched (the first
training step, whose FLOPs are counted), so the per-hook cost is what Lightning already pays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from anemoi_profiler.clock.intervals import STAGES
from anemoi_profiler.trainer.lightning_private import CALLBACK_PREFIX, FETCH_ACTIONS


class LoopTimer:
    def __init__(self, profiler: Any, now: Callable[[], float] = time.perf_counter) -> None:
        self.wrapped = profiler
        self._now = now
        self.fetch_s = dict.fromkeys(STAGES, 0.0)
        """Seconds fetching per stage, until `BatchGaps` takes them at a batch's end (and zeroes them)."""
        self.fetches = dict.fromkeys(STAGES, 0)
        self._fetch_started = 0.0
        self.profile = profiler.profile
        self._sample: dict[str, float] | None = None
        self._around: tuple[str, Callable[[], AbstractContextManager[Any]]] | None = None

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

    # ---- sampling the callbacks' hooks, watching one block ----
    def start_sample(self) -> None:
        """Time every callback hook until `end_sample` (one gap between two batches, once per log interval)."""
        self._sample = {}
        self.profile = self._watching_profile

    def end_sample(self) -> dict[str, float]:
        """Seconds per callback state key since `start_sample`."""
        sample, self._sample = self._sample or {}, None
        self._unwatch_if_idle()
        return sample

    def around_next(self, action_name: str, context: Callable[[], AbstractContextManager[Any]]) -> None:
        """Run the next `profile(action_name)` block (say Lightning's `run_training_batch`: the step alone,
        without any callback's hooks) inside `context()`, once."""
        self._around = (action_name, context)
        self.profile = self._watching_profile

    def cancel_around(self) -> bool:
        """Drop the block `around_next` waits for; True when there was one (Lightning never ran it)."""
        pending, self._around = self._around, None
        self._unwatch_if_idle()
        return pending is not None

    def _unwatch_if_idle(self) -> None:
        if self._sample is None and self._around is None:
            self.profile = self.wrapped.profile

    @contextmanager
    def _watching_profile(self, action_name: str) -> Iterator[str]:
        around = self._around
        if around is not None and action_name == around[0]:
            self._around = None
            self._unwatch_if_idle()
            with around[1](), self.wrapped.profile(action_name) as name:
                yield name
            return
        started = self._now()
        with self.wrapped.profile(action_name) as name:
            yield name
        if self._sample is not None and action_name.startswith(CALLBACK_PREFIX):
            state_key = action_name[len(CALLBACK_PREFIX) :].rsplit(".", 1)[0]
            self._sample[state_key] = self._sample.get(state_key, 0.0) + self._now() - started


def unwrapped(profiler: Any) -> Any:
    """The user's profiler behind a `LoopTimer`."""
    return profiler.wrapped if isinstance(profiler, LoopTimer) else profiler
