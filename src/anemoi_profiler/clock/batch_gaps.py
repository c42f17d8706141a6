"""Where the host time between two measured batches goes: data fetch, other callbacks, Lightning's loop.

The gap from our `on_batch_end` to our next `on_batch_start` holds, in order: the other callbacks'
`on_batch_end` that run after ours, Lightning's loop (logging, the per-batch stop-signal broadcast with several
ranks, the fetch, the batch's transfer to the device), and the `on_batch_start` of callbacks before ours. The
`LoopTimer` that stands in for the trainer's profiler times both: each fetch wherever it runs (in the gap, or
inside a `dataloader_iter` training step) and each other callback's hook in the gap (see `loop_timer` for why
it, and no callback of ours in the user's list, is the instrument of other callbacks' time). The profiler's own
work (a trace export in our `on_batch_end`) is taken out; the rest is Lightning's loop. Per batch that is two
`perf_counter` readings at each end and a reading around each other callback's hook in the gap (this code runs
between torch's operators, with cold caches: each call costs microseconds); once per log interval one gap is
also split callback by callback, to name them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from anemoi_profiler.clock.intervals import STAGES, GapTimes
from anemoi_profiler.clock.loop_timer import LoopTimer
from anemoi_profiler.clock.own_work import OwnWorkClock


class BatchGaps:
    def __init__(self, own_work: OwnWorkClock, now: Callable[[], float] = time.perf_counter) -> None:
        self._own_work = own_work
        self._now = now
        self.loop_timer: LoopTimer | None = None
        self.callback_seconds: dict[str, list[float]] = {}
        """Per other callback's state key: [seconds in its hooks over the sampled gaps, sampled gaps]."""
        # The loop timer's own, once attached: it adds each fetch, `batch_ended` takes them.
        self._fetch_s = dict.fromkeys(STAGES, 0.0)
        self._fetches = dict.fromkeys(STAGES, 0)
        self._last_end: float | None = None
        self._own_work_at_end = 0.0
        self._callbacks_s = self._loop_s = 0.0  # this batch's gap before it, split when it started

    def attach(self, timer: LoopTimer, own_state_keys: frozenset[str]) -> None:
        """Take the fetches and the other callbacks' hooks `timer` times; the callbacks in `own_state_keys` (the
        profiler's) are no other callbacks."""
        self.loop_timer = timer
        timer.leave_out(own_state_keys)
        self._fetch_s, self._fetches = timer.fetch_s, timer.fetches

    def batch_started(self) -> None:
        """Split the gap since the last batch's end into other callbacks' hooks and Lightning's loop."""
        now = self._now()
        callbacks_s = self._close_gap()
        last_end = self._last_end
        if last_end is None:
            self._callbacks_s = self._loop_s = 0.0
            return
        own_work = self._own_work.total_s - self._own_work_at_end  # our hooks' and the profiler's callbacks' work
        gap = max(0.0, now - last_end - own_work)
        self._callbacks_s = callbacks = min(gap, callbacks_s)
        self._loop_s = max(0.0, gap - callbacks - sum(self._fetch_s.values()))

    def batch_ended(self, stage: str, into: GapTimes | None, sample_next_gap: bool) -> None:
        """Add this batch's gap and fetches to `into` (an interval's, None while nothing is measured); with
        `sample_next_gap`, the next gap is timed callback by callback. Nothing is allocated per batch."""
        fetch_s, fetches = self._fetch_s, self._fetches
        if into is not None:
            into.wait_s += fetch_s[stage]
            into.fetches += fetches[stage]
            into.callbacks_s += self._callbacks_s
            into.loop_s += self._loop_s
        fetch_s[stage], fetches[stage] = 0.0, 0
        if self.loop_timer is not None:
            self.loop_timer.open_gap(sample_next_gap)
        self._last_end = self._now()
        self._own_work_at_end = self._own_work.total_s

    def drop_fetches(self, stage: str) -> None:
        """Fetches of `stage` so far are in no measured step (a validation's first batch, before its clock starts)."""
        self._fetch_s[stage], self._fetches[stage] = 0.0, 0

    def reset(self) -> None:
        """A stage starts or ends: the time across it is no batch's gap, and fetches before it are no batch's."""
        self._close_gap()
        self._last_end = None
        for stage in STAGES:
            self._fetch_s[stage], self._fetches[stage] = 0.0, 0

    def _close_gap(self) -> float:
        """Seconds in other callbacks' hooks since the last batch's end; a sampled gap's split is kept."""
        if self.loop_timer is None:
            return 0.0
        seconds, sample = self.loop_timer.close_gap()
        if sample is not None:
            for state_key, spent in sample.items():
                self.callback_seconds.setdefault(state_key, [0.0, 0.0])[0] += spent
            for totals in self.callback_seconds.values():
                totals[1] += 1
        return seconds

    def callbacks_ms(self) -> dict[str, float]:
        """Mean milliseconds per batch in each other callback's hooks between steps, largest first."""
        means = {key: total / gaps * 1000 for key, (total, gaps) in self.callback_seconds.items() if gaps}
        return dict(sorted(means.items(), key=lambda item: item[1], reverse=True))
