"""Run HTA over trace folders within a time limit, and say what ran, what was skipped and why.

Each window's analyses run in one child process (see `hta_worker`), which is killed when the time limit
is reached: HTA has no time limit of its own and can take minutes on a large trace. Results go to
`<out_dir>/<stage>/window_<k>/` (or `<out_dir>/` for a plain trace folder) as CSV and JSON tables, and
a `summary.json` is always left behind.

Metric names: a window's summary holds `hta/rank<r>/<name>` (and `hta/all_ranks/<name>`), what a
callback logs for the window it just traced; `analyze()` over a run folder also gathers them all as
`hta/<stage>/window_<k>/rank<r>/<name>` so that windows do not overwrite each other.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from anemoi_profiler import names
from anemoi_profiler.analysis import hta_worker
from anemoi_profiler.analysis.hta_worker import ANALYSIS_NAMES, LOAD_STEP, PROGRESS_FILE, TABLE_NAMES
from anemoi_profiler.analysis.preflight import (
    NoTracesError,
    WindowCheck,
    check_window,
    find_window_dirs,
    window_name,
)
from anemoi_profiler.report_sections import MB
from anemoi_profiler.run_files.layout import HTA_SUMMARY_FILE

HTA_INSTALL_HINT = 'pip install "anemoi-profiler[hta]"'
DEFAULT_TIME_LIMIT_S = 300.0
DEFAULT_MEMORY_LIMIT_MB = 8000.0
POLL_S = 0.1
"""How often the worker's time and resident memory are checked."""
LOG_FILE = "hta.log"

NO_GPU_KERNELS = "no GPU kernels in the trace (CPU-only profile)"
NO_NCCL_KERNELS = "no NCCL kernels (single process, or communication off the GPU)"
NO_MEMORY_COPIES = "no memcpy/memset events"
NO_CUDA_SYNC = (
    "no CUDA synchronization events; record them with torch.profiler.profile(experimental_config="
    "torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True))"
)
NO_PROFILER_STEP = "no ProfilerStep annotation to pick a step from"


class HtaNotInstalledError(ImportError):
    """HTA (`import hta`) is missing; the message says how to install it."""


def require_hta() -> None:
    try:
        spec = importlib.util.find_spec("hta.trace_analysis")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise HtaNotInstalledError(f"Holistic Trace Analysis is not installed: {HTA_INSTALL_HINT}")


def plan_analyses(check: WindowCheck) -> tuple[list[str], dict[str, str]]:
    """The analyses the traces can support, and a one-line reason for each one they cannot.

    Args:
        check: What `check_window` read of a trace folder.

    Returns:
        The names of the analyses to run, and a reason by name for each one left out.
    """
    if not check.gpu_kernels:
        return [], dict.fromkeys(ANALYSIS_NAMES, NO_GPU_KERNELS)
    skipped = {}
    if not check.nccl_kernels:
        skipped["comm_comp_overlap"] = NO_NCCL_KERNELS
    if not check.memory_copies:
        skipped["memory_bw_summary"] = NO_MEMORY_COPIES
    if not check.cuda_sync_events:
        skipped["critical_path"] = NO_CUDA_SYNC
    elif not check.profiler_steps:
        skipped["critical_path"] = NO_PROFILER_STEP
    return [name for name in ANALYSIS_NAMES if name not in skipped], skipped


@dataclass(frozen=True)
class Limits:
    """What the analyses of one call may use together: seconds in all, and resident memory of the HTA process."""

    time_limit_s: float
    memory_limit_mb: float | None
    deadline: float
    """`time.monotonic()` at which what is left is skipped."""

    @classmethod
    def starting_now(cls, time_limit_s: float, memory_limit_mb: float | None) -> Limits:
        return cls(time_limit_s, memory_limit_mb, time.monotonic() + time_limit_s)


def analyze_window(
    folder: Path,
    out_dir: Path,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    memory_limit_mb: float | None = None,
    ranks: Collection[int] | None = None,
) -> dict[str, Any]:
    """Analyse one trace folder (one file per rank; of `ranks` only, when given).

    Args:
        folder: A folder with one trace file per rank.
        out_dir: Where HTA's tables and `summary.json` go.
        time_limit_s: Seconds for all analyses together (default 300); those left when it runs out are
            skipped, saying so.
        memory_limit_mb: Resident memory past which the HTA process is stopped; None: no limit.
        ranks: The ranks to analyse; None: every rank with a file.

    Returns:
        The window's summary, with what ran and what was skipped (and why), the figures per rank, and the
        `metrics` for MLflow.

    Raises:
        NoTracesError: The folder holds no trace files (of `ranks`).
        TraceError: A file is corrupt or not a Chrome trace; the message names it.
        HtaNotInstalledError: HTA is not installed.
    """
    limits = Limits.starting_now(time_limit_s, memory_limit_mb)
    check = check_window(Path(folder), ranks)
    require_hta()
    return _analyze_checked(check, Path(out_dir), limits, window="")


def analyze(
    target: Path,
    out_dir: Path,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    memory_limit_mb: float | None = None,
    ranks: Collection[int] | None = None,
) -> dict[str, Any]:
    """Analyse every window of a run folder, or one plain trace folder, within one time limit in all; the HTA
    process is stopped past `memory_limit_mb` of resident memory. `ranks` picks the ranks analysed.

    Every file is checked before HTA starts, so that a corrupt file fails in seconds, not after minutes.

    Args:
        target: A run folder (every window below its `traces/`), a trace folder, or a downloaded `traces/`.
        out_dir: Where the results go, one folder per window, with `summary.json` over all of them.
        time_limit_s: Seconds for every window together (default 300); analyses left when it runs out are
            skipped, saying so.
        memory_limit_mb: Resident memory past which the HTA process is stopped; None: no limit.
        ranks: The ranks to analyse; None: every rank with a file.

    Returns:
        The summary written to `out_dir/summary.json`, with one entry per window in `windows` and the
        `metrics` (`<window>/...` names) for MLflow.

    Raises:
        NoTracesError: No trace files in or below `target`.
        TraceError: A file is corrupt or not a Chrome trace; the message names it.
        HtaNotInstalledError: HTA is not installed.
    """
    started = time.monotonic()
    limits = Limits.starting_now(time_limit_s, memory_limit_mb)
    target, out_dir = Path(target), Path(out_dir)
    windows = find_window_dirs(target)
    if not windows:
        raise NoTracesError(f"no trace files (*.json, *.json.gz) in {target} or below it")
    checks = [check_window(folder, ranks) for folder in windows]
    require_hta()
    summaries = []
    metrics: dict[str, float] = {}
    for check in checks:
        name = window_name(check.folder, target)
        window = _analyze_checked(check, out_dir / name if name else out_dir, limits, window=name)
        summaries.append(window)
        metrics.update(_prefixed(window["metrics"], name))
    summary = {
        "target": str(target),
        "out_dir": str(out_dir),
        "time_limit_s": time_limit_s,
        "memory_limit_mb": memory_limit_mb,
        "peak_rss_mb": max((window.get("peak_rss_mb", 0.0) for window in summaries), default=0.0),
        "seconds": round(time.monotonic() - started, 2),
        "windows": summaries,
        "metrics": metrics,
    }
    write_summary(out_dir, summary)
    return summary


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / HTA_SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _analyze_checked(check: WindowCheck, out_dir: Path, limits: Limits, window: str) -> dict[str, Any]:
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_previous_results(out_dir)
    to_run, skipped = plan_analyses(check)
    summary: dict[str, Any] = {
        "window": window,
        "folder": str(check.folder),
        "out_dir": str(out_dir),
        **check.as_dict(),
        "warnings": check.warnings,
        "ran": [],
        "skipped": skipped,
        "failed": {},
        "metrics": {},
        "top_kernels": [],
        "analysis_seconds": {},
    }
    if to_run:
        records, stopped, exit_code, summary["peak_rss_mb"] = _run_worker(check, to_run, out_dir, limits)
        _merge_records(summary, to_run, records, stopped, exit_code)
    summary["tables"] = [name for name in TABLE_NAMES if (out_dir / f"{name}.csv").exists()]
    summary["seconds"] = round(time.monotonic() - started, 2)
    write_summary(out_dir, summary)
    return summary


def _run_worker(
    check: WindowCheck, to_run: list[str], out_dir: Path, limits: Limits
) -> tuple[list[dict[str, Any]], str | None, int | None, float]:
    """Run the analyses in a child process in its own process group; kill the group at the deadline or past
    the memory limit (watched every `POLL_S`: an address-space limit would break numpy). Returns the records,
    why it was stopped (None when it ended by itself), its exit code and its peak resident memory (MB).

    The worker runs as a script, not with `-m`: that would import `anemoi_profiler` (torch, Lightning)
    first and spend seconds of the time limit before HTA starts."""
    if limits.deadline <= time.monotonic():
        return [], _time_limit(limits), None, 0.0
    plan = {
        "folder": str(check.folder),
        "out_dir": str(out_dir),
        "trace_files": {str(rank): str(path) for rank, path in check.trace_files.items()},
        "analyses": to_run,
        "nccl_kernel_names": check.nccl_kernel_names,
        # HTA drops the last step; skip the first too when a middle one remains (it misses events).
        "critical_path_step": 1 if check.profiler_steps >= 3 else 0,
    }
    progress = out_dir / PROGRESS_FILE
    progress.unlink(missing_ok=True)
    stopped, peak_mb = None, 0.0
    with (out_dir / LOG_FILE).open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, hta_worker.__file__],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # a worker that died at once: its exit code says why
                process.stdin.write(json.dumps(plan).encode())
                process.stdin.close()
            while stopped is None and not _ended(process):
                peak_mb = max(peak_mb, _resident_mb(process.pid))
                if time.monotonic() >= limits.deadline:
                    stopped = _time_limit(limits)
                elif limits.memory_limit_mb and peak_mb > limits.memory_limit_mb:
                    stopped = f"memory limit of {limits.memory_limit_mb:g} MB reached (hta.memory_limit_mb)"
        finally:  # also on KeyboardInterrupt: the child is in its own session and would outlive us
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    records = _read_progress(progress)
    progress.unlink(missing_ok=True)
    return records, stopped, None if stopped else process.returncode, round(peak_mb, 1)


def _ended(process: subprocess.Popen[bytes]) -> bool:
    try:
        process.wait(POLL_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _resident_mb(pid: int) -> float:
    """Resident memory of the worker and its children (HTA parses traces in a process pool)."""
    try:
        worker = psutil.Process(pid)
        processes = [worker, *worker.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total / MB


def _time_limit(limits: Limits) -> str:
    return f"time limit of {limits.time_limit_s:g} s reached"


def _merge_records(
    summary: dict[str, Any],
    to_run: list[str],
    records: list[dict[str, Any]],
    stopped: str | None,
    exit_code: int | None,
) -> None:
    for record in records:
        if "warning" in record:
            summary["warnings"].append(record["warning"])
            continue
        name = record["analysis"]
        if "seconds" in record:
            summary["analysis_seconds"][name] = record["seconds"]
        if record["status"] == "failed":
            summary["failed"][name] = record["error"]
        elif name != LOAD_STEP:
            summary["ran"].append(name)
            summary["metrics"].update({names.HTA + key: value for key, value in record["metrics"].items()})
            summary["warnings"].extend(f"{name}: {warning}" for warning in record["warnings"])
            summary["top_kernels"] = record["top_kernels"] or summary["top_kernels"]
    finished = {record.get("analysis") for record in records}
    for name in to_run:
        if name in finished:
            continue
        if stopped:
            summary["skipped"][name] = stopped
        elif LOAD_STEP in summary["failed"]:
            summary["skipped"][name] = "HTA could not load the traces"
        else:
            summary["failed"][name] = f"HTA process ended (exit code {exit_code}) before it; see {LOG_FILE}"


def _read_progress(progress: Path) -> list[dict[str, Any]]:
    if not progress.exists():
        return []
    records = []
    for line in progress.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by the kill
            records.append(json.loads(line))
    return records


def _remove_previous_results(out_dir: Path) -> None:
    """Only the files we write, so that a stale table never passes for a fresh one."""
    for name in TABLE_NAMES:
        for suffix in (".csv", ".json"):
            (out_dir / f"{name}{suffix}").unlink(missing_ok=True)
    for name in (HTA_SUMMARY_FILE, LOG_FILE, PROGRESS_FILE):
        (out_dir / name).unlink(missing_ok=True)


def _prefixed(metrics: dict[str, float], window: str) -> dict[str, float]:
    if not window:
        return dict(metrics)
    return {names.hta_window(window, key): value for key, value in metrics.items()}
