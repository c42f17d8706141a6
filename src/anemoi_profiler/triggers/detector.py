"""Decide from per-log-interval figures when a profiling window is worth opening: plain numbers in, no torch.

Three detectors, each fed once per training log interval with figures the profiler already exchanges:

- `DriftDetector`: the interval's step time against a robust baseline of the recent in-control intervals
  (median and MAD of log step time). It fires when `confirm` consecutive intervals are slower than the
  baseline median by more than `min_slowdown` and by more than `sigmas` spreads.
- `SlowRankDetector`: each rank's wait for the gradient all-reduce. The rank that waits least is the one the
  others wait for; its lag (the others' mean wait beyond its own) as a share of the step time, against a
  baseline of that share, fires when the same rank leads for `confirm` consecutive intervals.
- `MemoryClimbDetector`: each rank's peak memory rising in every one of `intervals` consecutive intervals,
  by `min_growth` in all.

Every rank feeds the same gathered figures in the same order, so every rank reaches the same decision at the
same batch: no extra collective is needed to agree on it. `Triggers` adds the budget (cooldown, maximum).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

MAD_TO_SIGMA = 1.4826
"""Scales a median absolute deviation to the standard deviation of normal noise."""
MIN_BASELINE = 5
"""Intervals a baseline needs before its detector may fire."""

REASONS = ("schedule", "drift", "slow-rank", "memory", "request")


@dataclass(frozen=True)
class Evidence:
    """Why a window opened: the statistic's value against its baseline and threshold (same unit)."""

    statistic: str
    value: float
    baseline_median: float
    baseline_spread: float
    threshold: float

    def describe(self) -> str:
        return (
            f"{self.statistic} {self.value:.4g} > threshold {self.threshold:.4g} "
            f"(baseline median {self.baseline_median:.4g}, spread {self.baseline_spread:.4g})"
        )


@dataclass(frozen=True)
class Trigger:
    """A detector's decision: the reason, the ranks that matter (empty: the configured ones) and the evidence."""

    reason: str
    ranks: tuple[int, ...]
    evidence: Evidence


class RobustBaseline:
    """Median and MAD-based spread of the last `size` in-control values."""

    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self._values.append(value)

    def clear(self) -> None:
        self._values.clear()

    @property
    def ready(self) -> bool:
        return len(self._values) >= MIN_BASELINE

    def median(self) -> float:
        return median(self._values)

    def spread(self) -> float:
        center = self.median()
        return MAD_TO_SIGMA * median(abs(value - center) for value in self._values)


class DriftDetector:
    """A sustained rise of the step time, on log step time so that the threshold is relative.

    Every one of `confirm` consecutive intervals must be slower than the baseline median by the larger of
    `min_slowdown` and `sigmas` spreads: one interval with a hiccup (a checkpoint, a garbage collection)
    never fires, and noisier runs need a larger slowdown.
    """

    def __init__(self, warmup: int, baseline_intervals: int, min_slowdown: float, sigmas: float, confirm: int) -> None:
        self._warmup_left = warmup
        self._baseline = RobustBaseline(baseline_intervals)
        self._min_excess = math.log1p(min_slowdown)
        self._sigmas = sigmas
        self._confirm = confirm
        self._exceeded: list[float] = []

    def feed(self, step_ms: float) -> Trigger | None:
        if step_ms <= 0:
            return None
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return None
        value = math.log(step_ms)
        if not self._baseline.ready:
            self._baseline.add(value)
            return None
        center, spread = self._baseline.median(), self._baseline.spread()
        excess = max(self._min_excess, self._sigmas * spread)
        if value - center <= excess:
            self._exceeded = []
            self._baseline.add(value)
            return None
        self._exceeded.append(value)
        if len(self._exceeded) < self._confirm:
            return None
        slowest_kept = min(self._exceeded)
        self._exceeded = []
        self._baseline.clear()  # the slower step is the new normal: learn it before firing again
        median_ms = math.exp(center)
        evidence = Evidence(
            f"least step time of the last {self._confirm} intervals (ms)",
            math.exp(slowest_kept),
            median_ms,
            median_ms * spread,
            median_ms * math.exp(excess),
        )
        return Trigger("drift", (), evidence)


class SlowRankDetector:
    """One rank becoming the one the others wait for, from each rank's wait in the gradient all-reduce."""

    def __init__(self, warmup: int, baseline_intervals: int, min_lag: float, sigmas: float, confirm: int) -> None:
        self._warmup_left = warmup
        self._baseline = RobustBaseline(baseline_intervals)
        self._min_lag = min_lag
        self._sigmas = sigmas
        self._confirm = confirm
        self._culprit: int | None = None
        self._exceeded = 0

    def feed(self, waits_ms: list[float], step_ms: float) -> Trigger | None:
        """`waits_ms`: each rank's wait per optimizer step, by global rank; `step_ms`: the interval's step time."""
        if len(waits_ms) < 2 or step_ms <= 0:
            return None
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return None
        culprit = min(range(len(waits_ms)), key=waits_ms.__getitem__)
        others = [wait for rank, wait in enumerate(waits_ms) if rank != culprit]
        lag = (sum(others) / len(others) - waits_ms[culprit]) / step_ms
        if not self._baseline.ready:
            self._baseline.add(lag)
            return None
        center, spread = self._baseline.median(), self._baseline.spread()
        threshold = center + max(self._min_lag, self._sigmas * spread)
        if lag <= threshold:
            self._exceeded, self._culprit = 0, None
            self._baseline.add(lag)
            return None
        self._exceeded = self._exceeded + 1 if culprit == self._culprit else 1
        self._culprit = culprit
        if self._exceeded < self._confirm:
            return None
        self._exceeded, self._culprit = 0, None
        self._baseline.clear()
        evidence = Evidence("lag of the awaited rank (share of step time)", lag, center, spread, threshold)
        return Trigger("slow-rank", _ranks_to_record(culprit, waits_ms), evidence)


def _ranks_to_record(culprit: int, waits_ms: list[float]) -> tuple[int, ...]:
    """The culprit, a rank of median wait (a typical one) and rank 0."""
    by_wait = sorted(range(len(waits_ms)), key=waits_ms.__getitem__)
    return tuple(sorted({culprit, by_wait[len(by_wait) // 2], 0}))


class MemoryClimbDetector:
    """Peak memory rising interval after interval on some ranks."""

    def __init__(self, warmup: int, intervals: int, min_growth: float) -> None:
        self._warmup_left = warmup
        self._intervals = intervals
        self._min_growth = min_growth
        self._history: dict[int, deque[float]] = {}

    def feed(self, peaks_mb: list[float]) -> Trigger | None:
        """`peaks_mb`: each rank's peak memory in the interval (allocated on a GPU, else resident), by rank."""
        if self._warmup_left > 0:  # caches and allocator pools fill up first
            self._warmup_left -= 1
            return None
        climbing: list[tuple[float, int, float, float]] = []  # (growth, rank, first, last)
        for rank, peak in enumerate(peaks_mb):
            if peak <= 0:
                continue
            history = self._history.setdefault(rank, deque(maxlen=self._intervals + 1))
            history.append(peak)
            values = list(history)
            if len(values) <= self._intervals or any(b <= a for a, b in pairwise(values)):
                continue
            growth = values[-1] / values[0] - 1
            if growth >= self._min_growth:
                climbing.append((growth, rank, values[0], values[-1]))
        if not climbing:
            return None
        self._history.clear()
        growth, _, first, last = max(climbing)
        evidence = Evidence(
            f"peak memory (MB) after {self._intervals} rising intervals", last, first, 0.0,
            first * (1 + self._min_growth),
        )  # fmt: skip
        return Trigger("memory", tuple(sorted(rank for _, rank, _, _ in climbing)), evidence)


@dataclass
class IntervalFigures:
    """What the detectors read from one training log interval, gathered from every rank."""

    step: int
    """The global step at the interval's end."""
    step_ms: float
    waits_ms: list[float] | None
    """Each rank's wait in the gradient all-reduce per optimizer step; None when not timed (or one rank)."""
    peaks_mb: list[float]


class Triggers:
    """The enabled detectors under one budget: a cooldown in steps between windows and a maximum per run."""

    def __init__(
        self,
        drift: DriftDetector | None,
        slow_rank: SlowRankDetector | None,
        memory: MemoryClimbDetector | None,
        cooldown_steps: int,
        max_windows: int,
    ) -> None:
        self.drift, self.slow_rank, self.memory = drift, slow_rank, memory
        self._cooldown_steps = cooldown_steps
        self.windows_left = max_windows
        self._quiet_until = -1
        self.last: tuple[int, Trigger] | None = None
        """The step and trigger of the last window opened."""

    @property
    def armed(self) -> list[str]:
        kinds = (("drift", self.drift), ("slow-rank", self.slow_rank), ("memory", self.memory))
        return [name for name, detector in kinds if detector is not None]

    def observe(self, figures: IntervalFigures) -> Trigger | None:
        """Feed every detector (their baselines keep learning), then apply the budget to what fired."""
        fired = [
            trigger
            for trigger in (
                self.slow_rank.feed(figures.waits_ms, figures.step_ms)
                if self.slow_rank is not None and figures.waits_ms
                else None,
                self.memory.feed(figures.peaks_mb) if self.memory is not None else None,
                self.drift.feed(figures.step_ms) if self.drift is not None else None,
            )
            if trigger is not None
        ]  # a lagging rank slows every step: it names the cause, so it goes before drift
        if not fired or self.windows_left <= 0 or figures.step < self._quiet_until:
            return None
        self.windows_left -= 1
        self._quiet_until = figures.step + self._cooldown_steps
        self.last = (figures.step, fired[0])
        return fired[0]
