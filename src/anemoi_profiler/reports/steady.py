"""The run's headline figures, one definition for the console, report.txt/json/html, MLflow's `summary/...`, the
run description, `compare` and the diagnosis.

The **steady steps** are one set, the same for every headline and per-sample figure (samples/s, items/s,
batches/s, MFU, step time, data wait, energy per sample): the training steps after `throughput.warmup_steps`
that `steps.json` does not flag, so outside profiling windows and without the profiler's own work (trace export,
snapshot dump), nor an epoch's first step or the first after validation (`run_files.steps_file.FLAGS`). The stage
clock leaves the flagged steps' batches and time out of every log interval (`StageMeter.leave_out`); validation
and the profiler's own work are never training time. Of the log intervals, **slow stretches** are set apart too:
intervals whose time per batch is more than `SLOW_STRETCH_FACTOR` times the median interval's (a slow start,
another job on the node beside the first steps). A rate is the steady intervals' count over their seconds and a
per-batch time their seconds over their batches: what a clock around those batches reads, not a median of
intervals nor a mean that a slow start moves. Energy per sample is the steady power over the steady samples/s. The
slow stretches get figures of their own (`summary/train/slow_stretch_*`), which the diagnosis names; the all-in
rates (`summary/train/..._all_in`, `ALL_IN`) count every batch after the warmup, over every second of it.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from statistics import median

SLOW_STRETCH_FACTOR = 1.5
"""An interval whose time per batch exceeds this multiple of the median interval's is a slow stretch."""
MIN_INTERVALS_TO_SPLIT = 3
"""With fewer log intervals there is no median to tell a slow one by: every interval is steady."""
LABEL = (
    "steady state: the steps after warmup, outside profiling windows, epoch starts and the profiler's own work, "
    f"slow stretches (log intervals over {SLOW_STRETCH_FACTOR:g}x the median interval's time per batch) set apart"
)
"""The headline figures' name where they are shown."""
DEFINITION = f"{LABEL}; rates = their samples / their seconds, step times = their seconds / their batches"
ALL_IN = (
    "every batch after warmup over every second of it: profiling windows, flagged steps, slow stretches, the "
    "profiler's own work and epoch starts in, validation apart"
)
"""What the all-in rates (`summary/train/..._all_in`) count."""
NOT_ENOUGH = "not enough steady batches"
"""Shown in place of a figure when every batch of the stage fell within the warmup."""


@dataclass(frozen=True)
class Interval:
    """One log interval as rank 0 logged it: its global step, batches, seconds and the figures logged for it."""

    step: int
    batches: float
    seconds: float
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def seconds_per_batch(self) -> float:
        return self.seconds / self.batches if self.batches else 0.0


class IntervalLog:
    """A stage's log intervals as numbers in columns, 8 bytes a number: a run of a million steps keeps a few MB, not
    a dict per interval. `intervals()` gives them back as `Interval`s when the run ends."""

    def __init__(self) -> None:
        self._steps = array("q")
        self._batches = array("d")
        self._seconds = array("d")
        self._figures: dict[str, array[float]] = {}  # NaN where an interval had no such figure

    def __len__(self) -> int:
        return len(self._steps)

    def append(self, step: int, batches: float, seconds: float, figures: dict[str, float]) -> None:
        count = len(self._steps)
        for key in figures:  # in the figures' order (not a set's, which varies between runs): the report's rows
            if key not in self._figures:
                self._figures[key] = array("d", [math.nan] * count)
        for key, column in self._figures.items():
            column.append(figures.get(key, math.nan))
        self._steps.append(step)
        self._batches.append(batches)
        self._seconds.append(seconds)

    @property
    def columns(self) -> int:
        """Numbers kept per interval."""
        return 3 + len(self._figures)

    def intervals(self) -> list[Interval]:
        return [
            Interval(
                step,
                batches,
                seconds,
                {key: column[index] for key, column in self._figures.items() if not math.isnan(column[index])},
            )
            for index, (step, batches, seconds) in enumerate(
                zip(self._steps, self._batches, self._seconds, strict=True)
            )
        ]


@dataclass(frozen=True)
class Split:
    steady: list[Interval]
    slow: list[Interval]


def split(intervals: list[Interval]) -> Split:
    """The steady intervals and the slow stretches among them (see the module's docstring)."""
    timed = [interval for interval in intervals if interval.batches and interval.seconds > 0]
    if len(timed) < MIN_INTERVALS_TO_SPLIT:
        return Split(timed, [])
    limit = SLOW_STRETCH_FACTOR * median(interval.seconds_per_batch for interval in timed)
    return Split(
        [interval for interval in timed if interval.seconds_per_batch <= limit],
        [interval for interval in timed if interval.seconds_per_batch > limit],
    )


def combined(intervals: list[Interval]) -> dict[str, float]:
    """Each figure over the intervals that have it: rates (`..._per_sec`, MFU) weighted by seconds, per-batch times
    by batches, so that one rank's samples/s is their samples over their seconds. Rank numbers are not averaged."""
    totals: dict[str, list[float]] = {}
    for interval in intervals:
        for key, value in interval.figures.items():
            if key.endswith("_rank"):
                continue
            weight = interval.seconds if key.endswith(("_per_sec", "mfu")) else interval.batches
            weighted = totals.setdefault(key, [0.0, 0.0])
            weighted[0] += value * weight
            weighted[1] += weight
    return {key: total / weight for key, (total, weight) in totals.items() if weight > 0}


def stretch_steps(slow: list[Interval]) -> str:
    """The slow stretches' log intervals, by the global step at each one's end: `10, 20`."""
    steps = sorted(interval.step for interval in slow)
    return ", ".join(map(str, steps))


HEADLINE_ORDER = ("samples_per_sec", "items_per_sec", "batches_per_sec", "mfu")
"""The rates of a stage in the report's order: the headline, samples/s, first."""


def headline_first(rates: dict[str, float]) -> dict[str, float]:
    """`rates` (`throughput/<stage>[/device]/<rate>`) in the report's order: every rank's before one device's,
    then by `HEADLINE_ORDER`, then by name; the same order on every run, whatever order they were made in."""

    def rank(key: str) -> tuple[bool, int, str]:
        last = key.rsplit("/", 1)[-1]
        order = HEADLINE_ORDER.index(last) if last in HEADLINE_ORDER else len(HEADLINE_ORDER)
        return "/device/" in key, order, key

    return {key: rates[key] for key in sorted(rates, key=rank)}
