"""The diagnosis's check of slow stretches: log intervals after the warmup that ran much slower than the rest.

The steady figures set them apart (`reports.steady`), so that a slow start or another job beside the first
minutes does not move the headline; this names them when they took a noticeable share of the training. A module
of its own beside `diagnosis`, which lists it in `CHECKS`.
"""

from __future__ import annotations

from anemoi_profiler import names
from anemoi_profiler.reports.outcome import NotAssessed, Outcome, Verdict
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.reports.steady import SLOW_STRETCH_FACTOR

SLOW_STRETCH_SHARE = 0.10
"""Share of the measured training time in slow stretches above which the diagnosis names them."""
SLOW_STRETCH_SHARE_HIGH = 0.30


def slow_stretches(run: RunData) -> Outcome:
    if run.steady(names.TRAIN_STEP_MS) is None and run.steady(names.TRAIN_SAMPLES_PER_SEC) is None:
        return NotAssessed("no steady training figures: timing and throughput off, or too few batches after warmup")
    share = run.last(names.slow_stretch("train", "share"))
    seconds = run.last(names.slow_stretch("train", "s"))
    if share is None or seconds is None or share < SLOW_STRETCH_SHARE:
        return None
    slow_rate = run.last(names.slow_stretch("train", "samples_per_sec"))
    rate = run.steady(names.TRAIN_SAMPLES_PER_SEC)
    rates = f"; {slow_rate:.4g} samples/s there against {rate:.4g} steady" if slow_rate and rate else ""
    return Verdict(
        "slow-stretch",
        "slow stretch",
        "high" if share >= SLOW_STRETCH_SHARE_HIGH else "medium",
        f"{share:.0%} of the measured training time ({seconds:.3g} s) ran in log intervals over "
        f"{SLOW_STRETCH_FACTOR:g}x the median interval's step time{rates}",
        "Part of the training after the warmup ran much slower than the rest: a slow start (caches, allocator, "
        "compilation, the first files read), or other work on the machine then. The steady figures leave it out; "
        "a clock around the whole run reads less.",
        "See which steps (the report's Throughput section, the step-time plot): at the start, raise "
        "throughput.warmup_steps or warm the input pipeline up; later, look at the system metrics for other load "
        "then (CPU, another process on the GPU).",
    )
