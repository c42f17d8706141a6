"""The session's post-mortem: what a run that stalls, runs out of memory or is stopped leaves in postmortem/.

Made with the session (so NCCL's Flight Recorder is on before the process group exists), started with the run
folder (where the Flight Recorder dumps, CUDA's out-of-memory observer), armed when training starts (the stall
watchdog, the signal handlers), and closed at the session's end. Nothing of it runs per step on the training
thread: the watchdog reads the stage clock's counters from its own thread, the rest runs only on an error or a
signal; only `postmortem.memory_history` (off by default) makes CUDA record every allocation.

Each rank writes its own records. Rank 0, the one rank with an MLflow sink, also tells the run at once, while
the job still hangs: the tag `profiler.postmortem` and a line of the description; at the end it tags the run
with every kind of record in postmortem/. A signal with no handler of its own to call ends the process: rank 0
first writes metrics.json and closes the MLflow run as KILLED.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from anemoi_profiler.config_sections import PostmortemConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.postmortem import oom
from anemoi_profiler.postmortem.signals import SignalRecorder
from anemoi_profiler.postmortem.stacks import describe, frames_of, phase_of, thread_stacks, user_frame
from anemoi_profiler.postmortem.watchdog import Progress, StallWatchdog, merge_episode, write_json
from anemoi_profiler.profiling import torch_private
from anemoi_profiler.run_files.layout import flight_recorder_prefix, signal_path
from anemoi_profiler.run_files.postmortem_files import (
    OUT_OF_MEMORY,
    SIGNAL,
    STALL,
    TAG,
    headline,
    kinds,
    read_stalls,
    stall_told,
    stopped,
    told,
)
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.trainer import trainer_info

log = get_logger(__name__)

CLOSE_TIMEOUT_S = 30.0
"""Longest wait for MLflow before a signal's default action ends the process (a scheduler's grace is ~30 s)."""
FLIGHT_RECORDER_ENTRIES = "2000"
"""Flight Recorder entries kept when the user has not chosen (torch's documented example value)."""
BUFFER_ENV, DUMP_FILE_ENV = torch_private.flight_recorder_names()
_dump_file_set: str | None = None  # the dump file name this process set, if any


class PostmortemRecorder:
    def __init__(self, config: PostmortemConfig) -> None:
        self.config = config
        self.run_dir: Path | None = None
        self.rank, self.world_size = 0, 1
        self.sink: TrackingSink | None = None
        self._write_metrics: Callable[[Path], object] | None = None
        self._watchdog: StallWatchdog | None = None
        self._signals: SignalRecorder | None = None
        self._trainer: Any = None
        self._clock: Any = None
        self._recorded_errors: set[int] = set()
        self._history_started = False
        self._kinds: list[str] = []
        if config.enabled and config.flight_recorder:
            _turn_on_flight_recorder()

    def start(
        self,
        run_dir: Path,
        rank: int,
        world_size: int,
        sink: TrackingSink | None,
        write_metrics: Callable[[Path], object] | None,
    ) -> None:
        """With the run folder: where the Flight Recorder dumps, the memory history, the out-of-memory observer.
        `write_metrics` writes metrics.json (rank 0), for a signal that ends the process before the fit ends."""
        self.run_dir, self.rank, self.world_size, self.sink = run_dir, rank, world_size, sink
        self._write_metrics = write_metrics
        self._kinds = []
        if not self.config.enabled:
            return
        if self.config.flight_recorder and torch.cuda.is_available():
            _dump_into(flight_recorder_prefix(run_dir))
        if torch.cuda.is_available():
            oom.attach_observer()
            if self.config.memory_history and not _recording_history():
                self._history_started = oom.start_memory_history(self.config.memory_history_entries)

    def train_started(self, trainer: Any, clock: Any) -> None:
        """On the training thread, after Lightning set its signal handlers: arm the watchdog and ours."""
        if not self.config.enabled or self.run_dir is None:
            return
        self._trainer, self._clock = trainer, clock
        if self.config.signals and self._signals is None:
            self._signals = SignalRecorder(self._on_signal)
            self._signals.install()
        if self._watchdog is None:
            progress = Progress(
                finished=lambda: clock.train_batches_seen + clock.steps.stages["val"].count,
                step=lambda: trainer_info.global_step(trainer),
                recent_steps_s=lambda: [float(s) for s in clock.steps.stages["train"].recorded()[0][-50:]],
                all_reduce_pending=lambda: clock.gradient_sync.all_reduce_pending,
            )
            self._watchdog = StallWatchdog(
                self.run_dir,
                self.rank,
                self.world_size,
                self.config.stall_after_s,
                progress,
                self._on_stall,
                _dump_flight_recorder,
            )
            self._watchdog.start()

    def train_ended(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def close(self) -> None:
        """At the session's end: the watchdog stops, the signal handlers that were there come back. Never raises."""
        try:
            self.train_ended()
            if self._signals is not None:
                self._signals.restore()
                self._signals = None
            if self._history_started:
                self._history_started = False
                torch_private.stop_memory_history()
        except Exception as error:
            log.warning("could not end the post-mortem watch: %s: %s", type(error).__name__, error)
        self._trainer = self._clock = None

    def header(self) -> dict[str, str]:
        """For the report's header (rank 0 at the end, when every rank has written its records)."""
        found = headline(self.run_dir) if self.run_dir is not None else None
        return {"postmortem": found} if found else {}

    def tag_run(self, sink: TrackingSink) -> None:
        """Rank 0 at the end, when every rank has written its files: each stall merged once more (a rank may have
        added its part's end after the last merge), and the tag for every kind of record in postmortem/."""
        if self.run_dir is None:
            return
        for stall in read_stalls(self.run_dir):
            merge_episode(self.run_dir, stall["episode"], stall["world_size"])
        if found := kinds(self.run_dir):
            sink.set_tags({TAG: ",".join(found)})

    # ---- what happened ----
    def exception(self, trainer: Any, error: BaseException) -> None:
        """Each callback's `on_exception` passes the error: recorded once, when it is an out-of-memory error."""
        if not self.config.enabled or self.run_dir is None or id(error) in self._recorded_errors:
            return
        self._recorded_errors.add(id(error))
        found = oom.find(error)
        if found is None:
            return
        batches = self._clock.train_batches_seen if self._clock is not None else 0
        path = oom.record(self.run_dir, self.rank, trainer_info.global_step(trainer), batches, error, found)
        log.warning("rank %d ran out of memory (%s); the record is %s", self.rank, found[0], path)
        self._tell(OUT_OF_MEMORY, f"out of memory on rank {self.rank} at step {trainer_info.global_step(trainer)}")

    def _on_stall(self, merged: dict[str, Any]) -> None:
        if self.rank == 0:
            self._tell(STALL, stall_told(merged))

    def _on_signal(self, signum: signal.Signals, frame: FrameType | None, ends: bool) -> None:
        assert self.run_dir is not None
        step = trainer_info.global_step(self._trainer) if self._trainer is not None else 0
        frames = frames_of(frame)
        record = {
            "rank": self.rank,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "signal": signum.name,
            "step": step,
            "phase": phase_of(frames),
            "frame": describe(user_frame(frames)),
            "process_ends": ends,
            "threads": thread_stacks(),
        }
        write_json(signal_path(self.run_dir, self.rank), record)
        log.warning("rank %d received %s at step %d", self.rank, signum.name, step)
        # MLflow's client and the sink's queue may be mid-call on this very thread: send from another one
        sender = threading.Thread(target=self._tell_and_end, args=(stopped(record), ends), daemon=True)
        sender.start()
        if ends:
            sender.join(timeout=60.0)

    def _tell_and_end(self, what: str, ends: bool) -> None:
        self._tell(SIGNAL, what)
        if ends:  # no end of the fit follows: what was measured goes to disk and to MLflow now, the run is KILLED
            if self._write_metrics is not None and self.run_dir is not None:
                self._write_metrics(self.run_dir)
            if self.sink is not None:
                self.sink.spool_now()
                self.sink.close("KILLED", timeout_s=CLOSE_TIMEOUT_S)

    def _tell(self, kind: str, what: str) -> None:
        """The tag and a line of the description, now (the job may hang or end before its report)."""
        if kind not in self._kinds:
            self._kinds.append(kind)
        if self.sink is None:
            return
        try:
            self.sink.set_tags({TAG: ",".join(self._kinds)})
            self.sink.set_description(told(what))
        except Exception as error:
            log.warning("could not tell MLflow (%s): %s: %s", what, type(error).__name__, error)


def _turn_on_flight_recorder() -> None:
    """Before the process group exists, where the user chose nothing: the Flight Recorder keeps the last
    collectives (torch reads the size when it makes the process group)."""
    if BUFFER_ENV in os.environ or "TORCH_NCCL_TRACE_BUFFER_SIZE" in os.environ:
        return
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return  # too late for this job's process group
    os.environ[BUFFER_ENV] = FLIGHT_RECORDER_ENTRIES
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


def _dump_into(prefix: Path) -> None:
    """NCCL's dump on a timeout goes to this run folder (torch reads the name when it dumps), unless the user
    chose a place: a name an earlier run of this process set is the profiler's to change."""
    global _dump_file_set
    if os.environ.get(DUMP_FILE_ENV, _dump_file_set) != _dump_file_set:
        return
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _dump_file_set = os.environ[DUMP_FILE_ENV] = str(prefix)


def _dump_flight_recorder(folder: Path) -> dict[str, Any] | None:
    """This rank's Flight Recorder as it is now, as `torchfrtrace` reads it (`<folder>/flight_recorder/rank_<r>`),
    and each process group's last collective; None where torch has no recorder for the backend."""
    try:
        if not torch.distributed.is_initialized():
            return None
        dump = torch_private.flight_recorder_dump()
        if dump is None:
            return None
        path = folder / "flight_recorder" / f"rank_{torch.distributed.get_rank()}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(dump)
        return last_collectives(pickle.loads(dump))
    except Exception as error:
        log.info("no Flight Recorder dump: %s: %s", type(error).__name__, error)
        return None


def last_collectives(dump: dict[str, Any]) -> dict[str, Any]:
    """Per process group, the last collective the recorder saw: its name, sequence number and state."""
    last: dict[str, Any] = {}
    for entry in dump.get("entries", []):
        group = entry.get("process_group", ("", ""))[1] or str(entry.get("pg_id"))
        if entry.get("is_p2p"):
            continue
        last[group] = {
            "collective": entry.get("profiling_name"),
            "seq": entry.get("collective_seq_id"),
            "state": entry.get("state"),
        }
    return last


def _recording_history() -> bool:
    """The memory snapshot callback may record already: then it owns the history."""
    try:
        return bool(torch_private.memory_snapshot().get("device_traces"))
    except Exception:
        return False
