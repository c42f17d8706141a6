"""The base of callbacks that turn the session's training and validation log intervals into metrics.

Every such callback of a session listens to one `StageClock`, which one internal callback drives from
Lightning's hooks (`clock.clock_callback`: the session puts it into the trainer's list when the first listener
joins).
The interval callbacks define no batch hook and measure nothing per batch: what they need measured, they ask
the clock for when the session starts (how to count samples, memory peaks); per log interval they receive one
`LogIntervalReport` (`on_log_interval`). An error in one of them stops its own metrics (the clock drops it) but
leaves the clock running for the others, and in step with the other ranks' exchanges.
"""

from __future__ import annotations

from typing import Any

from anemoi_profiler.callbacks.base import ProfilerCallback
from anemoi_profiler.clock import LogIntervalReport, RankTotals, StageMeter


class StageCallback(ProfilerCallback):
    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        self.clock = self.session.join_clock(self, trainer)

    def _start(self, trainer: Any, pl_module: Any) -> None:
        super()._start(trainer, pl_module)
        clock = getattr(self, "clock", None)
        if self.disabled and clock is not None:  # failed after joining: its metrics stop, the clock goes on
            clock.leave(self)

    def on_log_interval(self, report: LogIntervalReport) -> None:
        """Turn a log interval's measurements into metrics: the one call from the clock (work for rank 0)."""

    # ---- the session's intervals ----
    @property
    def meters(self) -> dict[str, StageMeter]:
        return self.clock.meters

    @property
    def totals(self) -> dict[str, RankTotals]:
        """This rank's totals per stage."""
        return self.clock.totals

    def gathered_totals(self, stage: str) -> list[RankTotals]:
        return self.clock.gathered_totals(stage)
