"""SIGTERM (a scheduler's time limit, `scancel`) and SIGUSR1 (`#SBATCH --signal=USR1@90`): record, then let the
signal do what it did before.

The handlers go in after Lightning's own (at the start of training: Lightning sets its SIGTERM handler and, for
SLURM auto-requeue, its SIGUSR1 one when the fit starts running), record first and then call the handler that was
there: Lightning's stops the fit gracefully or requeues the job, as without the profiler; where there was none,
the default action (the process ends) follows once what was measured is sent. Python runs a signal handler on
the main thread between bytecodes: a main thread blocked inside a collective runs it only when that returns, so
a hung job's stall record (written before) is what tells where it hung.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from anemoi_profiler.logs import get_logger

log = get_logger(__name__)

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))

OnSignal = Callable[[signal.Signals, FrameType | None, bool], None]
"""Called with the signal, the interrupted frame and whether the process ends right after (no handler of its own
was there, so the default action follows)."""


class SignalRecorder:
    def __init__(self, on_signal: OnSignal) -> None:
        self._on_signal = on_signal
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """In the main thread only (Python's rule); a signal ignored before stays ignored."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if previous in (signal.SIG_IGN, None) or previous == self._handle:
                continue
            signal.signal(signum, self._handle)
            self._previous[signum] = previous

    def restore(self) -> None:
        """Put back the handlers that were there, unless someone replaced ours meanwhile (Lightning's teardown
        puts back what it found before the fit, which did not include ours)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        ends = not callable(previous)
        try:
            self._on_signal(signal.Signals(signum), frame, ends)
        except Exception as error:
            log.warning("could not record %s: %s: %s", signum, type(error).__name__, error)
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)  # the default action, as if the profiler were not there
        os.kill(os.getpid(), signum)
