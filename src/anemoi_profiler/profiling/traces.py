"""Trace files laid out for HTA: `traces/<stage>/window_<k>/rank<r>.pt.trace.json.gz`, each naming its rank.

Export needs the profiler, so it runs on the training thread; compressing (and adding `distributedInfo` when
torch did not write it) runs on one background thread, so a profiled step does not also wait for gzip. The
size budget is checked in between: a trace too large for any viewer is never written.
"""

from __future__ import annotations

import gzip
import json
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch.distributed as dist

from anemoi_profiler.config_sections import TorchProfilerConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.report_sections import MB, format_value
from anemoi_profiler.run_files.layout import HELD_SUFFIX, TRACES_DIR, trace_path

log = get_logger(__name__)

RANK_INFO_KEY = "distributedInfo"
UNWRITABLE_BUDGETS = 4
"""A trace above this many times `trace_budget_mb` is not written: no viewer opens it."""
_HEAD_CHARS = 1 << 16  # kineto writes its metadata, distributedInfo included, before "traceEvents"
# Options that make traces large, biggest first, as the user turns them off.
_HEAVY_OPTIONS = ("with_stack", "record_shapes", "profile_memory", "with_modules")


def rank_info(rank: int, world_size: int) -> dict[str, Any]:
    """What HTA keys a trace by; torch writes it itself only once torch.distributed is initialized."""
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
    return {"rank": rank, "world_size": world_size, "backend": backend}


def open_trace(path: Path) -> IO[str]:
    """A trace file as text, gzipped or not."""
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def read_trace(path: Path) -> dict[str, Any]:
    with open_trace(path) as file:
        return json.load(file)


def has_rank_info(path: Path) -> bool:
    """Whether the trace carries `distributedInfo.rank`, reading only its metadata when it comes first."""
    with open_trace(path) as file:
        head = file.read(_HEAD_CHARS)
    events = head.find('"traceEvents"')
    if events < 0:
        return "rank" in (read_trace(path).get(RANK_INFO_KEY) or {})
    return f'"{RANK_INFO_KEY}"' in head[:events]


def add_rank_info(trace: dict[str, Any], info: dict[str, Any]) -> bool:
    """Set `distributedInfo` from `info` unless the trace already names its rank; True when changed."""
    existing = trace.get(RANK_INFO_KEY)
    if isinstance(existing, dict) and "rank" in existing:
        return False
    events = trace.pop("traceEvents", None)
    trace[RANK_INFO_KEY] = {**(existing if isinstance(existing, dict) else {}), **info}
    if events is not None:  # metadata first, as torch writes it, so `has_rank_info` finds it in the head
        trace["traceEvents"] = events
    return True


def write_ranked_trace(source: Path, target: Path, info: dict[str, Any]) -> None:
    """Write `source` (JSON, gzipped or not) to the gzipped `target`, adding `info` when it lacks a rank.

    The file appears under its final name only when complete, so a reader never sees half a trace.
    """
    partial = target.with_name(target.name + ".part")
    if not has_rank_info(source):
        trace = read_trace(source)
        add_rank_info(trace, info)
        with gzip.open(partial, "wt", compresslevel=6) as out:
            json.dump(trace, out)
    elif source.suffix == ".gz":
        shutil.copyfile(source, partial)
    else:
        with open(source, "rb") as plain, gzip.open(partial, "wb", compresslevel=6) as out:
            shutil.copyfileobj(plain, out, 1 << 20)
    partial.replace(target)


def json_size(path: Path) -> int:
    """Uncompressed size of a trace in bytes: what a viewer has to load."""
    if path.suffix != ".gz":
        return path.stat().st_size
    size = 0
    with gzip.open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            size += len(chunk)
    return size


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def traces_mb(run_dir: Path) -> float:
    """MB of every trace file in the run folder (every rank's, on a shared file system)."""
    traces_dir = run_dir / TRACES_DIR
    return folder_size(traces_dir) / MB if traces_dir.is_dir() else 0.0


@dataclass(frozen=True)
class TracesUpload:
    """Whether a run folder's traces go to MLflow with it: only while they stay below `upload_traces_max_mb`."""

    total_mb: float
    limit_mb: float

    @classmethod
    def of(cls, run_dir: Path, options: TorchProfilerConfig) -> TracesUpload:
        return cls(traces_mb(run_dir), options.upload_traces_max_mb)

    @property
    def uploaded(self) -> bool:
        return self.total_mb <= self.limit_mb

    @property
    def note(self) -> str:
        """What the report says about the upload ('' without traces)."""
        if not self.total_mb:
            return ""
        if self.uploaded:
            return "uploaded to MLflow with the run"
        return f"kept in the run folder only (over profiler.upload_traces_max_mb={self.limit_mb:g})"


class TraceBudget:
    """Trace bytes per profiled step, learnt from each written window, to size the next one in advance."""

    def __init__(self, options: TorchProfilerConfig) -> None:
        self.options = options
        self.budget_bytes = options.trace_budget_mb * MB
        self._bytes_per_step: dict[str, float] = {}

    def learn(self, stage: str, json_bytes: int, steps: int) -> None:
        if steps > 0:
            self._bytes_per_step[stage] = json_bytes / steps

    def estimate(self, stage: str, steps: int) -> float | None:
        per_step = self._bytes_per_step.get(stage)
        return per_step * steps if per_step is not None else None

    def writable(self, json_bytes: float) -> bool:
        return json_bytes <= UNWRITABLE_BUDGETS * self.budget_bytes

    def advice(self, stage: str, active: int) -> str:
        heavy = [f"profiler.{name}" for name in _HEAVY_OPTIONS if getattr(self.options, name)]
        turn_off = f"turn off {', '.join(heavy)} or " if heavy else ""
        return f"{turn_off}record fewer steps (profiler.{stage}.active is {active})"


class TraceWriter:
    """Writes each window's trace for one rank, within the size budget.

    With `profiler.traces: flagged` a rank other than 0 writes `<name>.held`, which the end of the run renames
    or deletes once the window summaries say whether this rank stands out (`cluster/flagged_traces.py`).
    """

    def __init__(self, run_dir: Path, rank: int, world_size: int, options: TorchProfilerConfig) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.hold = options.traces == "flagged" and rank != 0
        self.info = rank_info(rank, world_size)
        self.budget = TraceBudget(options)
        self.skipped: list[str] = []
        self._said: set[object] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anemoi-profiler-traces")
        self._pending: list[Future[Path | None]] = []

    @property
    def options(self) -> TorchProfilerConfig:
        return self.budget.options

    def check_next_window(self, stage: str, active: int) -> None:
        """Warn (once per stage) before a window whose trace the last one says will be over the budget."""
        estimate = self.budget.estimate(stage, active)
        if estimate is None or estimate <= self.budget.budget_bytes:
            return
        fate = "" if self.budget.writable(estimate) else "; it will not be written (no viewer opens such a trace)"
        log.warning_once(
            self._said,
            stage,
            "the next %s profiling window's trace will be about %s, over "
            "profiler.trace_budget_mb=%g%s. To shrink it, %s.",
            stage,
            format_value(estimate / MB, "MB"),
            self.options.trace_budget_mb,
            fate,
            self.budget.advice(stage, active),
        )

    def write(self, prof: Any, stage: str, window: int, steps: int, active: int) -> Future[Path | None]:
        """Export the window just recorded, then gzip it in the background unless it is too large: the future
        of the file written (of None if it is not)."""
        target = trace_path(self.run_dir, stage, window, self.rank)
        if self.hold:
            target = target.with_name(target.name + HELD_SUFFIX)
        exported = target.parents[1] / f".window_{window}_rank{self.rank}.json"
        exported.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(exported))
        size = exported.stat().st_size
        self.budget.learn(stage, size, steps)
        name = f"{stage}/window_{window}"
        if not self.budget.writable(size):
            exported.unlink()
            self.skipped.append(name)
            log.warning(
                "trace of %s not written: %s is over %d x profiler.trace_budget_mb=%g, "
                "too large for any trace viewer. To shrink it, %s.",
                name,
                format_value(size / MB, "MB"),
                UNWRITABLE_BUDGETS,
                self.options.trace_budget_mb,
                self.budget.advice(stage, active),
            )
            not_written: Future[Path | None] = Future()
            not_written.set_result(None)
            return not_written
        if size > self.budget.budget_bytes:
            log.warning_once(
                self._said,
                stage,
                "trace of %s is %s, over profiler.trace_budget_mb=%g. To shrink it, %s.",
                name,
                format_value(size / MB, "MB"),
                self.options.trace_budget_mb,
                self.budget.advice(stage, active),
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        written: Future[Path | None] = self._executor.submit(self._compress, exported, target)
        self._pending.append(written)
        return written

    def _compress(self, exported: Path, target: Path) -> Path:
        try:
            write_ranked_trace(exported, target, self.info)
        finally:
            exported.unlink(missing_ok=True)
        return target

    def flush(self) -> None:
        """Wait until every trace handed over so far is on disk."""
        pending, self._pending = self._pending, []
        for future in pending:
            try:
                future.result()
            except Exception as error:
                log.warning("could not write a trace: %s: %s", type(error).__name__, error)

    def close(self) -> None:
        self.flush()
        self._executor.shutdown(wait=True)
