"""Stacks without the interpreter lock: faulthandler's C timer, pushed back by the stall watchdog while the run moves.

A training step wedged in C code that keeps the GIL stops every Python thread, the watchdog's included. The
watchdog therefore keeps `faulthandler.dump_traceback_later` armed `MARGIN_S` past its own threshold and re-arms
it from its own thread on each wake that sees a batch finish (never on the training thread: a re-arm starts an
OS thread, about 0.1 ms, once a second at most). When the watchdog can run, it records a stall itself and
disarms the timer first; when it cannot, the timer fires and writes every thread's stack to
`postmortem/faulthandler_rank<r>.txt`, after a header of what the watchdog last knew
(`run_files.faulthandler_dump`). The MLflow sender, another process, turns that dump into the stall's record and
tag while the job is still wedged; when the watchdog runs again it takes the same dump as its part of the same
episode, and moves it beside that part.

faulthandler's timer is one per process: this takes it only while training runs, only where the watchdog runs,
and one session at a time; `faulthandler.enable()` (the fatal-error handler, a user's or `-X faulthandler`) is a
separate thing that this leaves alone. A user's own `dump_traceback_later` (pytest's `faulthandler_timeout`)
is replaced while training runs. A forked child that exits normally while the timer is armed would hang in
CPython's finalization (it waits for the parent's C thread), so the timer is disarmed around every fork.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any

from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.faulthandler_dump import HEADER_BYTES, header_bytes, read_dump, wedged_part
from anemoi_profiler.run_files.layout import faulthandler_path, wedged_dump_path

log = get_logger(__name__)

MARGIN_S = 2.0
"""The timer fires this long after the watchdog's threshold: a watchdog that can run records the stall first."""
_owner: NativeStacks | None = None
"""The one instance that holds faulthandler's timer (it is process-global)."""
_owner_lock = threading.Lock()


class NativeStacks:
    """One rank's C timer; every method is called from the watchdog's thread (or after it stopped)."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, training_thread: int) -> None:
        self.run_dir, self.rank, self.world_size = run_dir, rank, world_size
        self.training_thread = training_thread
        self.training_thread_name = next(
            (thread.name for thread in threading.enumerate() if thread.ident == training_thread), "MainThread"
        )
        self.path = faulthandler_path(run_dir, rank)
        self._file: IO[bytes] | None = None
        self._armed: tuple[float, dict[str, Any]] | None = None
        """The timeout and header of the last arm, to arm again after a fork."""
        self._lock = threading.Lock()

    def open(self) -> bool:
        """Take faulthandler's timer for this rank; False when another session holds it or the file cannot be."""
        global _owner
        with _owner_lock:
            if _owner is not None:
                return False
            try:
                self._file = self._new_file()
            except OSError as error:
                log.info("no native stacks on a wedge: %s", error)
                return False
            _owner = self
        return True

    def _new_file(self) -> IO[bytes]:
        """Unbuffered, its offset past the header: faulthandler writes at the offset, the header is rewritten
        in place."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = open(self.path, "wb", buffering=0)  # noqa: SIM115  # held while faulthandler may write to it
        file.write(b" " * (HEADER_BYTES - 1) + b"\n")
        return file

    def written(self) -> bool:
        """faulthandler wrote after the header."""
        return self._file is not None and os.fstat(self._file.fileno()).st_size > HEADER_BYTES

    def arm(self, episode: int, timeout_s: float, step: int, batches_finished: int) -> None:
        """(Re-)arm: the timer fires `timeout_s` from now unless armed again or disarmed."""
        header = {
            "rank": self.rank,
            "world_size": self.world_size,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "episode": episode,
            "threshold_s": timeout_s - MARGIN_S,
            "timeout_s": timeout_s,
            "progress_at": time.time(),
            "last_step": step,
            "batches_finished": batches_finished,
            "training_thread": self.training_thread,
            "training_thread_name": self.training_thread_name,
        }
        with self._lock:
            if self._file is None:
                return
            self._arm(timeout_s, header)

    def _arm(self, timeout_s: float, header: dict[str, Any]) -> None:
        assert self._file is not None
        os.pwrite(self._file.fileno(), header_bytes(header), 0)  # faulthandler writes at the offset, after it
        faulthandler.dump_traceback_later(timeout_s, repeat=False, file=self._file)
        self._armed = (timeout_s, header)

    def disarm(self) -> None:
        with self._lock:
            if self._armed is not None:
                faulthandler.cancel_dump_traceback_later()  # waits for the C thread: a dump being written ends
                self._armed = None

    def wedge(self) -> dict[str, Any] | None:
        """After the timer fired: this rank's part of the stall it saw (the part the sender may have written
        already), with the dump moved beside it and a fresh file for the next episode. None while it has not."""
        with self._lock:
            if self._armed is None or not self.written():
                return None
        self.disarm()
        found = read_dump(self.path, settled_s=0.0)
        if found is None:
            return None
        header, threads, written = found
        part = wedged_part(header, threads, written)
        with self._lock:
            assert self._file is not None
            kept = wedged_dump_path(self.run_dir, header["episode"], self.rank)
            kept.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path, kept)
            self._file.close()
            self._file = self._new_file()
        return part

    def close(self) -> None:
        """At the end of training: the timer cancelled, the file gone (a dump no one took stays), the timer
        free for another session."""
        global _owner
        self.disarm()
        with self._lock:
            if self._file is not None:
                written = self.written()
                self._file.close()
                self._file = None
                if not written:
                    with contextlib.suppress(OSError):
                        self.path.unlink()
                        self.path.parent.rmdir()  # postmortem/ only if nothing else is there
        with _owner_lock:
            if _owner is self:
                _owner = None

    # ---- around a fork: the child must never inherit an armed timer ----
    def _before_fork(self) -> None:
        self._lock.acquire()
        if self._armed is not None:
            faulthandler.cancel_dump_traceback_later()

    def _after_fork_in_parent(self) -> None:
        try:
            if self._armed is not None and self._file is not None:
                self._arm(*self._armed)
        finally:
            self._lock.release()

    def _after_fork_in_child(self) -> None:
        global _owner
        self._armed = None
        self._file = None  # the parent's: the child never closes or writes it
        _owner = None
        self._lock = threading.Lock()


def _before_fork() -> None:
    if _owner is not None:
        _owner._before_fork()


def _after_fork_in_parent() -> None:
    if _owner is not None:
        _owner._after_fork_in_parent()


def _after_fork_in_child() -> None:
    global _owner_lock
    _owner_lock = threading.Lock()
    if _owner is not None:
        _owner._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
