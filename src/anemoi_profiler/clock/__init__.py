"""The stage clock: how long training and validation steps take, per log interval, without a device sync.

`stage_clock` is the session's one clock, driven by Lightning's batch hooks through the clock callback; its
docstring lists who measures what. `intervals` holds what it measures and reports (`StageMeter` times a stage,
`LogInterval` is one log interval, `RankTotals` what the ranks exchange, `LogIntervalReport` what the listeners
receive); `batch_gaps` and `loop_timer` split the time between steps into data fetch, other callbacks and
Lightning's loop; `batch_count`, `step_flops` and `memory_peaks` count samples and items, the first step's FLOPs
and memory peaks for the listeners that ask; `step_record` keeps each step's duration for `steps.json`. The
profiler's own work stays out of the figures: `own_work` times it so the clock can take it out, `eager` keeps the
profiler's own passes through a compiled model from costing its compilation anything.
"""

from anemoi_profiler.clock.batch_count import BatchCounter, batch_size_of
from anemoi_profiler.clock.batch_gaps import BatchGaps
from anemoi_profiler.clock.eager import can_run_eagerly, eager, is_compiled
from anemoi_profiler.clock.intervals import (
    STAGES,
    ExchangeControl,
    LogInterval,
    LogIntervalReport,
    RankTotals,
    StageMeter,
)
from anemoi_profiler.clock.loop_timer import LoopTimer, unwrapped
from anemoi_profiler.clock.memory_peaks import PEAK_FIELDS, MemoryPeaks
from anemoi_profiler.clock.own_work import OwnWorkClock
from anemoi_profiler.clock.stage_clock import IntervalListener, StageClock
from anemoi_profiler.clock.step_flops import FirstStepFlops

__all__ = [
    "PEAK_FIELDS",
    "STAGES",
    "BatchCounter",
    "BatchGaps",
    "ExchangeControl",
    "FirstStepFlops",
    "IntervalListener",
    "LogInterval",
    "LogIntervalReport",
    "LoopTimer",
    "MemoryPeaks",
    "OwnWorkClock",
    "RankTotals",
    "StageClock",
    "StageMeter",
    "batch_size_of",
    "can_run_eagerly",
    "eager",
    "is_compiled",
    "unwrapped",
]
