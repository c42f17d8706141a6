"""The one callback with batch hooks: it drives the session's stage clock from Lightning's hooks.

The session puts it into the trainer's callback list when the first interval callback joins the clock (right
after that callback), and takes it out at the session's end; the interval callbacks themselves define no batch
hook. Here, in one place, the clock learns where each batch, epoch and stage starts and ends; what it
measures, and with what, is listed in `clock.stage_clock`. Installing it also installs the clock's
instruments that must sit in the trainer: the loop timer standing in for the trainer's profiler (the data wait
and the other callbacks' hook time, `loop_timer`) and the gradient-sync timer's comm hook (the collective wait).
Nothing else goes into the user's callback list. An error in the clock stops it (logged once): training and the
other callbacks go on.
"""

from __future__ import annotations

from typing import Any

from anemoi_profiler.clock import LoopTimer, StageClock
from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.steps_file import CHECKPOINT
from anemoi_profiler.trainer.callback_base import Callback

log = get_logger(__name__)


class StageClockCallback(Callback):
    def __init__(self, session: Any, clock: StageClock) -> None:
        self.session = session  # what marks it as the profiler's own (its hook time is not "other callbacks'")
        self.clock = clock
        self.stopped = False
        self._installed: tuple[Any, LoopTimer] | None = None

    def install(self, trainer: Any, after: Any) -> None:
        """Into `trainer.callbacks` right after `after`, with the loop timer. A new list, never the list changed
        in place: Lightning is iterating over the old one (calling `setup`).

        A trainer without a profiler or a callback list (a stand-in) gets none of them: its data wait is then not
        assessed, and its hooks are called by hand."""
        self.clock.gradient_sync.wrap_user_hook(trainer)  # before the strategy's setup registers it
        if getattr(trainer, "profiler", None) is None or not isinstance(getattr(trainer, "callbacks", None), list):
            return
        callbacks = list(trainer.callbacks)
        at = next((index + 1 for index, callback in enumerate(callbacks) if callback is after), len(callbacks))
        trainer.callbacks = [*callbacks[:at], self, *callbacks[at:]]
        timer = LoopTimer(trainer.profiler)
        trainer.profiler = timer
        ours = [callback for callback in trainer.callbacks if self._is_ours(callback)]
        self.clock.gaps.attach(timer, frozenset(callback.state_key for callback in ours))
        self._installed = (trainer, timer)

    def remove(self) -> None:
        """Out of the trainer, with the loop timer; the clock measures no more."""
        self.clock.close()
        installed, self._installed = self._installed, None
        if installed is None:
            return
        trainer, timer = installed
        if trainer.profiler is timer:
            trainer.profiler = timer.wrapped
        trainer.callbacks = [callback for callback in trainer.callbacks if callback is not self]

    def _is_ours(self, callback: Any) -> bool:
        return getattr(callback, "session", None) is self.session

    def _failed(self, hook: str, error: Exception) -> None:
        if not self.stopped:
            self.stopped = True
            log.warning(
                "the stage clock stopped after an error in %s: %s: %s (training continues; no more interval metrics)",
                hook,
                type(error).__name__,
                error,
            )

    def _call(self, hook: str, work: Any, *args: Any) -> None:
        if self.stopped:
            return
        try:
            work(*args)
        except Exception as error:
            self._failed(hook, error)

    def _postmortem(self, what: str, work: Any, *args: Any) -> None:
        """The session's post-mortem recorder at the training's start and end; its failure stops only it."""
        try:
            work(*args)
        except Exception as error:
            log.warning("the post-mortem recorder could not %s: %s: %s", what, type(error).__name__, error)

    # ---- per batch: the clock measures; an error stops it ----
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self.stopped:
            try:
                self.clock.train_batch_start()
            except Exception as error:
                self._failed("on_train_batch_start", error)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.stopped:
            try:
                self.clock.train_batch_end(trainer, batch)
            except Exception as error:
                self._failed("on_train_batch_end", error)

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self.stopped:
            try:
                self.clock.validation_batch_start(trainer)
            except Exception as error:
                self._failed("on_validation_batch_start", error)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self.stopped:
            try:
                self.clock.validation_batch_end(trainer, batch)
            except Exception as error:
                self._failed("on_validation_batch_end", error)

    # ---- stages ----
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_fit_start", self.clock.gradient_sync.register, trainer)  # the strategy wrapped the model

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_train_start", self.clock.train_start)
        self._postmortem("start", self.session.postmortem.train_started, trainer, self.clock)  # watchdog, signals

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_train_epoch_start", self.clock.train_epoch_start)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._postmortem("end", self.session.postmortem.train_ended)
        self._call("on_train_end", self.clock.train_end, trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_validation_start", self.clock.validation_start, trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._call("on_validation_end", self.clock.validation_end, trainer)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._call("on_save_checkpoint", self.clock.steps.mark, "train", CHECKPOINT)  # not steady state
