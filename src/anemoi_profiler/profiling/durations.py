"""Duration statistics in bounded memory: exact count, mean and max, quantiles from a uniform sample.

A 3-day run profiled with `repeat: 0` sees millions of batches; keeping a fixed-size reservoir (Vitter's
algorithm R) keeps memory flat while p50/p90 stay unbiased.
"""

from __future__ import annotations

import random
from typing import Any

RESERVOIR_SIZE = 1024


class Reservoir:
    def __init__(self, capacity: int = RESERVOIR_SIZE, seed: int = 0) -> None:
        self.capacity = capacity
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.sample: list[float] = []
        self._random = random.Random(seed)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.max = max(self.max, value)
        if len(self.sample) < self.capacity:
            self.sample.append(value)
        else:
            slot = self._random.randrange(self.count)
            if slot < self.capacity:
                self.sample[slot] = value

    def quantile(self, q: float) -> float:
        ordered = sorted(self.sample)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DurationStats:
    """Named durations in seconds, summarised in milliseconds."""

    def __init__(self) -> None:
        self._reservoirs: dict[str, Reservoir] = {}

    def add(self, name: str, seconds: float) -> None:
        reservoir = self._reservoirs.get(name)
        if reservoir is None:
            reservoir = self._reservoirs[name] = Reservoir()
        reservoir.add(seconds)

    def summary(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "count": r.count,
                "mean_ms": r.total / r.count * 1000,
                "p50_ms": r.quantile(0.5) * 1000,
                "p90_ms": r.quantile(0.9) * 1000,
                "max_ms": r.max * 1000,
            }
            for name, r in self._reservoirs.items()
        }
