"""The start-up and hot-path tricks that earn their place: each buys a figure a user would notice.

Each one's comment says what it buys, measured with and without it by `python benchmarks/startup_tricks.py`
(method and table: docs/benchmarks.md, "Start-up tricks"), which leaves a trick out by naming it in
`_ANEMOI_PROFILER_WITHOUT`, a variable only that harness sets. Tricks that bought less than 0.2 s of `fit()`
or 0.2 % of a step, and held no short-run figure, were removed. Torch-free: the MLflow sender process imports it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import IO, Any, NamedTuple

WITHOUT_VARIABLE = "_ANEMOI_PROFILER_WITHOUT"
"""Comma-separated tricks to leave out; set only by benchmarks/startup_tricks.py."""


class Sender(NamedTuple):
    """A sender process, the pipe it replies on, when it started (`time.monotonic`), and whether it has said it
    is ready (MLflow imported: a sender kept from a run is; see `sender.serve`)."""

    process: subprocess.Popen[str]
    replies: IO[str]
    started_at: float
    idle: bool = False
    """It imports MLflow in idle time (`import_in_idle_time`)."""
    ready: bool = False


def uses(trick: str) -> bool:
    return trick not in os.environ.get(WITHOUT_VARIABLE, "").split(",")


# ---- the MLflow sender waiting for this process's next run ----
# kept_sender: a run that ends well keeps its sender, MLflow imported, for the process's next run (a
# `trainer.test()` after the fit, the next fit of a notebook): that run's `fit()` returns 1.7 s sooner on 2
# shared cores (`startup_tricks.py --settings later_run`).
# prestart: the sender starts when the callbacks are made (`ProfilerSession`), so that it imports MLflow while
# the script builds its model, data and Trainer: a short first run's `fit()` returns 0.5 s sooner, 1 s with the
# callbacks made 2 s before the Trainer, as anemoi-training does (`--settings end,callbacks_first`).
_waiting: Sender | None = None
_waiting_lock = threading.Lock()


def waiting() -> Sender | None:
    """The sender waiting for this process's next run, if any."""
    return _waiting


def prestart(spawn: Callable[[], Sender]) -> None:
    """Start a sender for the next run with `spawn`, unless one is waiting already."""
    global _waiting
    with _waiting_lock:
        if not _alive(_waiting):
            _waiting = spawn()


def keep_for_next_run(sender: Sender) -> bool:
    """Keep a released sender for the next run, unless one is waiting already (or the trick is left out)."""
    global _waiting
    with _waiting_lock:
        if _alive(_waiting) or not uses("kept_sender"):
            return False
        _waiting = sender._replace(ready=True)
    return True


def take_waiting() -> Sender | None:
    global _waiting
    with _waiting_lock:
        taken, _waiting = _waiting, None
    return taken if _alive(taken) else None


def _alive(sender: Sender | None) -> bool:
    return sender is not None and sender.process.poll() is None


# ---- the sender's MLflow import, in idle time, raced when it is late ----
# idle_import: the sender imports MLflow (0.8 s of CPU or more) in a thread that runs only when a core would
# otherwise be idle (Linux's SCHED_IDLE), not beside the first steps at a nice level: a bare fit's early steps
# beside that import read -0.96 % with it, +3.48 % at nice 10 (`benchmarks/run.py --sections short`). Where no
# core is ever idle that thread starves, and an unprivileged process cannot leave SCHED_IDLE; so the training
# process races a second sender at normal priority against it once `RACE_AFTER_S` have passed or the run ends,
# and keeps whichever is ready first (`SenderProcess`).
RACE_AFTER_S = 10.0
"""How long a sender importing in idle time has before a second one, at normal priority, is raced against it."""
IDLE_SCHEDULING = sys.platform.startswith("linux")
"""SCHED_IDLE is Linux's, and there it is per thread."""


def imports_in_idle_time() -> bool:
    return IDLE_SCHEDULING and uses("idle_import")


def import_in_idle_time(do_import: Callable[[], None]) -> None:
    """Run `do_import` in a thread of its own at SCHED_IDLE (requests are then served at the process's own
    priority, by its main thread)."""

    def idly() -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        do_import()

    importer = threading.Thread(target=idly, name="anemoi-profiler-mlflow-import")
    importer.start()
    importer.join()


# ---- the sender process's start-up ----
LEFT_OUT_IMPORTS = frozenset({"pandas", "numpy"})
"""What MLflow imports only when it is installed (mlflow-skinny goes without them), for the datasets and model
signatures the sender never logs."""


class _LeaveOut(importlib.abc.MetaPathFinder):
    """Makes the `LEFT_OUT_IMPORTS` look absent to MLflow's own guarded imports."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in LEFT_OUT_IMPORTS:
            raise ModuleNotFoundError(f"the MLflow sender leaves {fullname} out", name=fullname)


@contextlib.contextmanager
def leaving_out_datasets() -> Iterator[None]:
    """leave_out_imports: the sender's start-up takes 0.37 s less CPU (and 60 MB less memory), which a short
    first run's end waits for (`startup_tricks.py --settings sender_start`)."""
    if not uses("leave_out_imports"):
        yield
        return
    finder = _LeaveOut()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def collector_paused_and_frozen() -> Iterator[None]:
    """gc_freeze: the collector would scan the hundreds of thousands of objects MLflow's import makes again and
    again; paused during the import and frozen after it, the sender's start-up takes 0.3 s less CPU
    (`startup_tricks.py --settings sender_start`)."""
    if not uses("gc_freeze"):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


# ---- the training's hot path ----
def skip_unused_hooks(callback: Any, base: type, hooks: tuple[str, ...]) -> None:
    """Of `hooks`, those the callback's class does not override (see `skip_hooks`)."""
    skip_hooks(callback, tuple(hook for hook in hooks if getattr(type(callback), hook) is getattr(base, hook)))


def skip_hooks(callback: Any, hooks: tuple[str, ...]) -> None:
    """hooks_none: Lightning calls every callable hook of every callback every batch (inside its profiler's
    context); one set to None on the instance it skips. Our unused hooks buy 25 µs a batch (`startup_tricks.py
    --settings probe`): 0.04 % of a 50 ms step. With the clock hooks of the stage callback that does not drive the
    clock, 0.6 points of the 7-8 ms step of the early-steps figure (1.40 % without, 0.78 % with:
    `startup_tricks.py --settings early`, by parts)."""
    if uses("hooks_none"):
        for hook in hooks:
            setattr(callback, hook, None)


_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


def _profile_nothing(action_name: str) -> contextlib.nullcontext[None]:
    return _NOTHING


def resting_profile(profiler: Any) -> Callable[[str], AbstractContextManager[Any]]:
    """quiet_profiler: the `profile` of our stand-in for the trainer's profiler (`run.clock.LoopTimer`) between
    samples. Lightning wraps every hook it calls, its own, the user's and ours (some 25 a batch), in
    `trainer.profiler.profile(name)`; its default profiler does nothing there in a generator-based context
    manager. Where that default is what we stand in for, the same nothing is a shared `nullcontext`, which
    Lightning enters and leaves at a fraction of the cost: 0.3 points of the 7-8 ms step of the early-steps
    figure (1.09 % without, 0.78 % with: `startup_tricks.py --settings early`, by parts, which counts only the
    callbacks' hooks: Lightning's own get the cheaper nothing too)."""
    if uses("quiet_profiler") and type(profiler).__name__ == "PassThroughProfiler":
        return _profile_nothing
    return profiler.profile
