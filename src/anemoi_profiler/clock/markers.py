"""Two marks in the trainer's callback list, first and last, so the stage clock sees where other callbacks' batch
hooks begin and end (see `clock.batch_gaps`).

Lightning runs every callback's `on_train_batch_start` in list order, then the step, then every callback's
`on_train_batch_end` (with `ModelCheckpoint` moved last). Ours can sit anywhere in the list; the marks, put
first and last when the session starts and taken out at its end, bound what the other callbacks spend there.
A mark goes in only where another callback has such hooks: each hook Lightning calls costs a few
microseconds a batch, which a mark with nothing to bound would spend for nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from anemoi_profiler.clock import BatchGaps
from anemoi_profiler.trainer.callback_base import Callback


class _Mark(Callback):
    """A mark does nothing but note the time."""

    def __init__(self, gaps: BatchGaps) -> None:
        self.gaps = gaps


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


def insert_marks(trainer: Any, gaps: BatchGaps, driver: Any, ours: Callable[[Any], bool]) -> tuple[_Mark, ...]:
    """The marks the gap around `driver` needs: first if another callback's batch-start hooks run before the
    driver's, last if another's batch-end hooks run after it (`ours` tells the profiler's callbacks apart).

    A new list, never the list changed in place: Lightning is iterating over the old one (calling `setup`).
    """
    callbacks = list(trainer.callbacks)
    at = next((index for index, callback in enumerate(callbacks) if callback is driver), None)
    before, after = (callbacks, callbacks) if at is None else (callbacks[:at], callbacks[at + 1 :])
    first = _any_hook(before, FirstCallbackMark.USED, ours)
    last = _any_hook(after, LastCallbackMark.USED, ours)
    marks = (FirstCallbackMark(gaps),) * first + (LastCallbackMark(gaps),) * last
    trainer.callbacks = [*marks[:first], *callbacks, *marks[first:]]
    return marks


def _any_hook(callbacks: list[Any], hooks: tuple[str, ...], ours: Callable[[Any], bool]) -> bool:
    return any(_does_something(c, hook) for c in callbacks if not ours(c) for hook in hooks)


def _does_something(callback: Any, hook: str) -> bool:
    """The hook is callable and not Lightning's empty `Callback.<hook>` (in either namespace)."""
    function = getattr(callback, hook, None)
    if not callable(function):
        return False
    return getattr(getattr(function, "__func__", function), "__qualname__", "") != f"Callback.{hook}"


def remove_marks(trainer: Any, marks: tuple[_Mark, ...]) -> None:
    """A new list too: Lightning may be iterating over the old one (calling `teardown`)."""
    trainer.callbacks = [callback for callback in trainer.callbacks if not any(callback is m for m in marks)]
