"""Two marks in the trainer's callback list, first and last, so the stage clock sees where other callbacks' batch
hooks begin and end (see `run.batch_gaps`).

Lightning runs every callback's `on_train_batch_start` in list order, then the step, then every callback's
`on_train_batch_end` (with `ModelCheckpoint` moved last). Ours can sit anywhere in the list; the marks, put
first and last when the session starts and taken out at its end, bound what the other callbacks spend there.
"""

from __future__ import annotations

import time
from typing import Any

from ..run.batch_gaps import BatchGaps
from .base import PER_BATCH_HOOKS, Callback


class _Mark(Callback):
    """A mark does nothing but note the time; Lightning skips the hooks it does not use (set to None)."""

    USED: tuple[str, ...] = ()

    def __init__(self, gaps: BatchGaps) -> None:
        self.gaps = gaps
        for hook in PER_BATCH_HOOKS:
            if hook not in self.USED:
                setattr(self, hook, None)


class FirstCallbackMark(_Mark):
    USED = ("on_train_batch_start", "on_validation_batch_start")

    def on_train_batch_start(self, *args: Any) -> None:
        self.gaps.callbacks_begin = time.perf_counter()

    def on_validation_batch_start(self, *args: Any) -> None:
        self.gaps.callbacks_begin = time.perf_counter()


class LastCallbackMark(_Mark):
    USED = ("on_train_batch_end", "on_validation_batch_end")

    def on_train_batch_end(self, *args: Any) -> None:
        self.gaps.callbacks_end = time.perf_counter()

    def on_validation_batch_end(self, *args: Any) -> None:
        self.gaps.callbacks_end = time.perf_counter()


def insert_marks(trainer: Any, gaps: BatchGaps) -> tuple[_Mark, _Mark]:
    """A new list, never the list changed in place: Lightning is iterating over the old one (calling `setup`)."""
    marks = FirstCallbackMark(gaps), LastCallbackMark(gaps)
    trainer.callbacks = [marks[0], *trainer.callbacks, marks[1]]
    return marks


def remove_marks(trainer: Any, marks: tuple[_Mark, ...]) -> None:
    """A new list too: Lightning may be iterating over the old one (calling `teardown`)."""
    trainer.callbacks = [callback for callback in trainer.callbacks if not any(callback is m for m in marks)]
