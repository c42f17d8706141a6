"""Host time the profiler spends on its own heavy work inside the training loop ("own work").

Exporting a trace, building operator tables or dumping a memory snapshot happens between batches, on the
training thread. The stage clock takes this time out of its intervals and out of the dataloader wait, so a
profiling window does not distort the figures the profiler reports about training.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class OwnWorkClock:
    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.total_s = 0.0
        self._now = now

    @contextmanager
    def measure(self) -> Iterator[None]:
        started = self._now()
        try:
            yield
        finally:
            self.total_s += self._now() - started
