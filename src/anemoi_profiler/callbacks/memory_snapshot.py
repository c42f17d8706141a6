"""CUDA caching-allocator snapshots (open them at https://pytorch.org/memory_viz), on a window and on failure.

Allocation history is recorded with `torch.cuda.memory._record_memory_history` from training batch
`memory_snapshot.start_step` for `steps` batches and dumped to `memory/snapshot_rank<r>.pickle`. With
`on_exception` (the default), recording already starts at `on_fit_start`: most out-of-memory errors happen in
the sanity check or the first batches, before any later window, and a snapshot without history cannot say
what allocated the memory. The price is history recording during those first batches (a few µs of host time
per allocation and free, and up to `max_entries` entries of several KB of host memory); the window then
starts with a cleared history. When the run dies, the history recorded so far (or, after the window, the
allocator state alone) goes to `memory/snapshot_rank<r>_exception.pickle` and the exception reaches the user
unchanged. Recording is always switched off at the end of the window and when the callback stops.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.callbacks.base import ProfilerCallback, guarded
from anemoi_profiler.logs import get_logger
from anemoi_profiler.measure.snapshot_reader import summarize_snapshot
from anemoi_profiler.profiling.torch_private import memory_snapshot, record_memory_history, stop_memory_history
from anemoi_profiler.report_sections import GB, MB, ReportSection
from anemoi_profiler.run_files.layout import snapshot_path
from anemoi_profiler.trainer import trainer_info

log = get_logger(__name__)

VIEWER = "https://pytorch.org/memory_viz"


@dataclass
class SnapshotDump:
    """One written snapshot: where, why, what it cost, and its summary (see `summarize_snapshot`)."""

    path: Path
    trigger: str
    size_bytes: int
    seconds: float
    summary: dict[str, Any]


def dump_snapshot(path: Path, trigger: str) -> SnapshotDump:
    """What `torch.cuda.memory._dump_snapshot` does (`_snapshot()`, then pickle), keeping the dict to summarize.

    Summarizing the dict in memory avoids reading back a file that can reach hundreds of MB.
    """
    started = time.perf_counter()
    snapshot = memory_snapshot()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        pickle.dump(snapshot, file)
    dump = SnapshotDump(path, trigger, path.stat().st_size, time.perf_counter() - started, summarize_snapshot(snapshot))
    log.info(
        "memory snapshot (%s) written to %s: %.1f MB in %.2f s; open it at %s",
        trigger,
        path,
        dump.size_bytes / MB,
        dump.seconds,
        VIEWER,
    )
    return dump


class WindowSnapshot:
    """The CUDA memory snapshot of one triggered or requested window on this rank (`request --memory`, the
    memory trigger): allocation history with Python stacks only (cheaper to record than "all") and at most
    `max_entries` events, from the window's first batch to its end.

    When `memory_snapshot.enabled` records already, its recording is left as it is (switching it off would
    cut that callback's history) and the dump holds what it records.
    """

    def __init__(self, max_entries: int, shared: bool) -> None:
        self._max_entries = max_entries
        self._shared = shared
        if not shared:
            record_memory_history(max_entries, python_stacks_only=True)

    def dump(self, path: Path, trigger: str) -> SnapshotDump:
        try:
            return dump_snapshot(path, trigger)
        finally:
            self.stop()

    def stop(self) -> None:
        if not self._shared:
            self._shared = True  # stops once
            stop_memory_history()


class MemorySnapshotCallback(ProfilerCallback):
    """Records CUDA allocation history for a window of training batches (and from the fit start when
    `on_exception`) and writes `memory/snapshot_rank<r>.pickle`; on CPU it notes that it was skipped.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
    """

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        options = self.config.memory_snapshot
        device = trainer_info.root_device(trainer)
        self.skipped_reason = None if device.type == "cuda" else f"memory snapshot needs CUDA; skipped on {device.type}"
        if self.skipped_reason:
            log.warning("%s", self.skipped_reason)
        self.rank = self.session.global_rank
        self.batches_seen = 0
        # -1 never matches the batch counter: that is how CPU runs skip the window at no per-batch cost.
        self.window_start = options.start_step if device.type == "cuda" else -1
        self.window_end = self.window_start + options.steps if device.type == "cuda" else -1
        self.recording = False
        self.window_dumped = False
        self.dumps: list[SnapshotDump] = []

    # ---- recording ----
    def _start_recording(self) -> None:
        """Start with an empty history: switching recording off clears it in every torch version."""
        self._stop_recording()
        record_memory_history(self.config.memory_snapshot.max_entries)
        self.recording = True

    def _stop_recording(self) -> None:
        if self.recording:
            self.recording = False
            stop_memory_history()

    def _dump_window(self) -> None:
        first, last = self.window_start, self.batches_seen - 1
        try:
            assert self.session.run_dir is not None  # hooks run once the session has its folder
            path = snapshot_path(self.session.run_dir, self.rank)
            self.dumps.append(dump_snapshot(path, f"training batches {first}-{last}"))
        finally:
            self.window_dumped = True
            self._stop_recording()

    # ---- hooks ----
    @guarded
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.skipped_reason is None and self.config.memory_snapshot.on_exception and not self.recording:
            self._start_recording()

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.batches_seen == self.window_start:
            self._start_recording()

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches_seen += 1
        if self.batches_seen == self.window_end:
            with self.session.own_work.measure():
                self._dump_window()

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Training stopped inside the window (max_steps, early stopping): keep what was recorded."""
        if self.recording and not self.window_dumped and self.batches_seen > self.window_start:
            self._dump_window()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._dump_at_exception(exception)
        super().on_exception(trainer, pl_module, exception)

    @guarded
    def _dump_at_exception(self, exception: BaseException) -> None:
        """Lightning re-raises the exception after the callbacks' on_exception; this only has to not raise."""
        if self.skipped_reason or not self.config.memory_snapshot.on_exception:
            return
        if not (self.recording or self.window_dumped):
            return
        history = "with allocation history" if self.recording else "allocator state only: recording had ended"
        try:
            assert self.session.run_dir is not None  # hooks run once the session has its folder
            path = snapshot_path(self.session.run_dir, self.rank, at_exception=True)
            self.dumps.append(dump_snapshot(path, f"{type(exception).__name__}, {history}"))
        finally:
            self._stop_recording()

    def stop_background_work(self) -> None:
        try:
            self._stop_recording()
        except Exception as error:  # stopping must never mask how the run ended
            log.warning("could not stop CUDA memory history recording: %s", error)

    # ---- report ----
    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        if self.skipped_reason:
            return [ReportSection.key_values("Memory snapshot", {"skipped": (self.skipped_reason, "")})], {}
        if not self.dumps:
            reason = f"training ended after {self.batches_seen} batches, before the window at batch {self.window_start}"
            return [ReportSection.key_values("Memory snapshot", {"not written": (reason, "")})], {}
        columns = ["file", "trigger", "size", "dump time", "reserved", "allocated", "peak in history", "events"]
        rows = [
            [
                dump.path.name,
                dump.trigger,
                f"{dump.size_bytes / MB:,.1f} MB",
                f"{dump.seconds:.2f} s",
                _gigabytes(dump.summary["reserved_bytes"]),
                _gigabytes(dump.summary["allocated_bytes"]),
                _gigabytes(dump.summary["peak_allocated_bytes"]),
                dump.summary["trace_entries"],
            ]
            for dump in self.dumps
        ]
        data = {
            dump.path.name: {"trigger": dump.trigger, "size_bytes": dump.size_bytes, "seconds": dump.seconds}
            | dump.summary
            for dump in self.dumps
        }
        note = f"Rank {self.rank}; open the files at {VIEWER}. Reserved and allocated are at dump time."
        summary = {
            names.SUMMARY_SNAPSHOT_DUMP_S: sum(dump.seconds for dump in self.dumps),
            names.SUMMARY_SNAPSHOT_MB: sum(dump.size_bytes for dump in self.dumps) / MB,
        }
        return [ReportSection("Memory snapshot", columns, rows, data, note)], summary


def _gigabytes(value: int | None) -> str:
    return "n/a" if value is None else f"{value / GB:,.2f} GB"
