"""The stage clock: how long training and validation steps take, per log interval, without a device sync.

`stage_clock` is the session's one clock, driven by Lightning's batch hooks; `intervals` holds what it measures
(`StageMeter` times a stage, `LogInterval` is one log interval, `RankTotals` what the ranks exchange); `batch_gaps` and
`loop_timer` split the time between steps into data fetch, other callbacks and Lightning's loop; `step_record`
keeps each step's duration for `steps.json`. The profiler's own work stays out of the figures: `own_work` times
it so the clock can take it out, `eager` keeps the profiler's own passes through a compiled model from costing
its compilation anything.
"""

from .batch_gaps import BatchGaps
from .eager import can_run_eagerly, eager, is_compiled
from .intervals import STAGES, ExchangeControl, LogInterval, RankTotals, StageMeter, batch_size_of
from .loop_timer import LoopTimer, unwrapped
from .own_work import OwnWorkClock
from .stage_clock import StageClock

__all__ = [
    "STAGES",
    "BatchGaps",
    "ExchangeControl",
    "LogInterval",
    "LoopTimer",
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
