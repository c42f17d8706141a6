"""The base of callbacks that turn the session's training and validation intervals into metrics.

Every such callback of a session listens to one `StageClock`. The first to start drives it from its four batch
hooks, which call the clock; the others' batch hooks return at once, and they only receive log intervals (see
`stage_clock`); subclasses therefore define none of the four. An error in the driving hooks stops the driving
(logged once); one in the driving callback's other hooks disables that callback's own metrics but leaves the
clock running for the others, and in step with the other ranks' exchanges.
"""

from __future__ import annotations

from typing import Any

from ..logs import get_logger
from ..reports.step_series import CHECKPOINT
from ..run.clock import LogInterval, LoopTimer, RankTotals, StageMeter
from .base import ProfilerCallback, guarded, log_failure
from .markers import insert_marks, remove_marks

log = get_logger(__name__)


class StageCallback(ProfilerCallback):
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.drives = False  # a callback that drove an earlier run's clock: not this one's, yet
        super().setup(trainer, pl_module, stage)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.drives:
            self.clock.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.drives:
            self.clock.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.drives:
            self.clock.on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.drives:
            self.clock.on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        clock = self.session.stage_clock
        assert clock is not None, "the session makes its stage clock when it starts"
        self.clock = clock
        self.reporting = True
        self.drives = clock.join(
            self,
            counts=type(self).count_batch is not StageCallback.count_batch,
            has_extras=type(self).interval_extras is not StageCallback.interval_extras,
        )
        if self.drives:
            clock.gradient_sync.wrap_user_hook(trainer)  # before the strategy's setup registers it
            self._install_timers(trainer)
            clock.hook_failed = self._driving_hook_failed

    def _driving_hook_failed(self, hook: str, error: Exception) -> None:
        self.drives = False
        self.disabled = True
        log_failure(self, hook, error)

    def _install_timers(self, trainer: Any) -> None:
        """The loop timer in place of the trainer's profiler (it times the fetches) and the callback marks.

        A trainer without either (a stand-in) gets neither: its data wait is then not assessed."""
        if getattr(trainer, "profiler", None) is None or not isinstance(getattr(trainer, "callbacks", None), list):
            return
        timer = LoopTimer(trainer.profiler)
        trainer.profiler = timer
        marks = insert_marks(trainer, self.clock.gaps, self, self._is_ours)
        ours = [c for c in trainer.callbacks if self._is_ours(c) or any(c is mark for mark in marks)]
        self.clock.gaps.attach(timer, frozenset(callback.state_key for callback in ours))
        self._installed: tuple[Any, LoopTimer, tuple[Any, ...]] | None = (trainer, timer, marks)

    def _is_ours(self, callback: Any) -> bool:
        return getattr(callback, "session", None) is self.session

    def stop_background_work(self) -> None:
        installed, self._installed = getattr(self, "_installed", None), None
        if installed is None:
            return
        trainer, timer, marks = installed
        if trainer.profiler is timer:
            trainer.profiler = timer.wrapped
        remove_marks(trainer, marks)

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

        Disabling the driving callback on one rank would leave the others waiting for it in the next
        exchange for `distributed.timeout_s`, and pair their collectives with another callback's.
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

    # ---- stage hooks: the driving callback forwards them to the clock ----
    @guarded
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.drives:  # the strategy has wrapped the model now
            self.clock.gradient_sync.register(trainer)

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.drives:
            self.clock.train_start()

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.drives:
            self.clock.train_epoch_start()

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.drives:
            self.clock.train_end(trainer)

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.drives:
            self.clock.validation_start(trainer)

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.drives:
            self.clock.validation_end(trainer)

    @guarded
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.drives:  # the save is in the step that ends next: not steady state
            self.clock.steps.mark("train", CHECKPOINT)
