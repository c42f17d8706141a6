"""Host time the profiler spends on its own heavy work inside the training loop ("own work").

Exporting a trace, building operator tables or dumping a memory snapshot happens between batches, on the
training thread. The stage clock takes this time out of its intervals and out of the dataloader wait, so a
profiling window does not distort the figures the profiler reports about training.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class OwnWorkClock:
    def __init__(self) -> None:
        self.total_s = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.total_s += time.perf_counter() - started
