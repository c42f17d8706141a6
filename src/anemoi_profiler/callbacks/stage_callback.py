"""The base of callbacks that turn the session's training and validation intervals into metrics.

Every such callback of a session listens to one `StageClock`, which one internal callback drives from
Lightning's hooks (`clock_callback`: the first interval callback of a session puts it into the trainer's list).
The interval callbacks define no batch hook: they receive log intervals (`on_log_intervals`). An error in one
of them disables its own metrics but leaves the clock running for the others, and in step with the other ranks'
exchanges.
"""

from __future__ import annotations

from typing import Any

from ..logs import get_logger
from ..run.clock import LogInterval, RankTotals, StageMeter
from .base import ProfilerCallback
from .clock_callback import StageClockCallback

log = get_logger(__name__)


class StageCallback(ProfilerCallback):
    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        clock = self.session.stage_clock
        assert clock is not None, "the session makes its stage clock when it starts"
        self.clock = clock
        self.reporting = True
        first = clock.join(
            self,
            counts=type(self).count_batch is not StageCallback.count_batch,
            has_extras=type(self).interval_extras is not StageCallback.interval_extras,
        )
        self.clock_callback = StageClockCallback(self.session, clock) if first else None
        if self.clock_callback is not None:
            self.clock_callback.install(trainer, after=self)

    def stop_background_work(self) -> None:
        clock_callback = getattr(self, "clock_callback", None)  # none before the session started
        if clock_callback is not None:
            clock_callback.remove()

    # ---- what subclasses provide ----
    def count_batch(self, stage: str, batch: Any) -> tuple[int, int]:
        """(samples, items) in a batch; the base only counts batches."""
        return 0, 0

    def interval_extras(self, stage: str) -> dict[str, float]:
        """Host-side readings taken at the end of each interval (e.g. peak memory), logged as they are."""
        return {}

    def rank_values(self, stage: str) -> dict[str, float]:
        """This rank's values for `RankTotals` fields, set on each interval it exchanges (e.g. peaks)."""
        return {}

    def first_train_batch(self, batch: Any, ended: bool) -> None:
        """Called at the start (`ended=False`) and at the end of the very first training batch."""

    def on_log_intervals(
        self, trainer: Any, stage: str, intervals: list[tuple[LogInterval, float]], ranks: list[RankTotals] | None
    ) -> None:
        """Turn measured intervals into metrics. `ranks[r]` holds rank r's totals over the same intervals."""

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

    def report_log_intervals(
        self, trainer: Any, stage: str, intervals: list[tuple[LogInterval, float]], ranks: list[RankTotals] | None
    ) -> None:
        """Run `on_log_intervals`, whose work is rank 0's alone, so that an error there cannot stop this rank's
        exchanges.

        Stopping the clock on one rank would leave the others waiting for it in the next exchange for
        `distributed.timeout_s`.
        """
        if not self.reporting or self.disabled:
            return
        try:
            self.on_log_intervals(trainer, stage, intervals, ranks)
        except Exception as error:
            self.reporting = False
            log.warning(
                "%s stopped logging interval metrics after an error: %s: %s (training continues)",
                type(self).__name__,
                type(error).__name__,
                error,
            )
