"""The HTA side of an analysis, run as a script in a child process (`python .../hta_worker.py`).

A child process lets the runner enforce a real time limit (it kills the process group, HTA's parsing
pool included), keeps HTA's logging and its pandas memory out of the caller (a training process, a
notebook), and survives HTA crashing. The runner sends a plan as JSON on stdin; each finished step is
appended as one JSON line to `PROGRESS_FILE`, so whatever ran before a kill is kept.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from hta.trace_analysis import TraceAnalysis

PROGRESS_FILE = ".hta_progress.jsonl"
LOAD_STEP = "load_traces"
TOP_KERNELS = 5
TABLE_NAMES = (
    "temporal_breakdown",
    "idle_time_breakdown",
    "idle_time_intervals",
    "kernel_type_breakdown",
    "gpu_kernel_breakdown",
    "comm_comp_overlap",
    "cuda_kernel_launch_stats",
    "queue_length_summary",
    "memory_bw_summary",
    "critical_path_summary",
)
"""Every table we write; the runner removes exactly these before a new analysis of the same folder."""


@dataclass
class Context:
    analyzer: TraceAnalysis
    ranks: list[int]
    out_dir: Path
    critical_path_step: int


@dataclass
class AnalysisResult:
    """What one HTA analysis found: metrics (keys below `hta/`), warnings, the top kernels."""

    metrics: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    top_kernels: list[dict[str, Any]] = field(default_factory=list)


def temporal_breakdown(ctx: Context) -> AnalysisResult:
    table = ctx.analyzer.get_temporal_breakdown(visualize=False)
    write_table(table, ctx.out_dir, "temporal_breakdown")
    outcome = AnalysisResult()
    for row in table.to_dict("records"):
        rank = int(row["rank"])
        outcome.metrics[rank_metric(rank, "idle_pct")] = row["idle_time_pctg"]
        outcome.metrics[rank_metric(rank, "compute_pct")] = row["compute_time_pctg"]
        outcome.metrics[rank_metric(rank, "non_compute_pct")] = row["non_compute_time_pctg"]
    return outcome


def idle_time_breakdown(ctx: Context) -> AnalysisResult:
    table, intervals = ctx.analyzer.get_idle_time_breakdown(
        ranks=ctx.ranks, visualize=False, show_idle_interval_stats=True
    )
    write_table(table, ctx.out_dir, "idle_time_breakdown")
    if intervals is not None:
        write_table(intervals, ctx.out_dir, "idle_time_intervals")
    idle = table.groupby(["rank", "idle_category"])["idle_time"].sum()
    share = 100 * idle / idle.groupby(level="rank").transform("sum")
    outcome = AnalysisResult()
    for (rank, category), pct in share.items():
        outcome.metrics[rank_metric(int(rank), f"idle_{category}_share_pct")] = round(pct, 2)
    return outcome


def gpu_kernel_breakdown(ctx: Context) -> AnalysisResult:
    analyzer = ctx.analyzer
    kernel_types, kernels = analyzer.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    write_table(kernel_types, ctx.out_dir, "kernel_type_breakdown")
    write_table(kernels, ctx.out_dir, "gpu_kernel_breakdown")
    outcome = AnalysisResult()
    for row in kernel_types.to_dict("records"):
        if " " not in row["kernel_type"]:  # COMPUTATION, not "COMPUTATION overlapping MEMORY"
            outcome.metrics[f"all_ranks/{row['kernel_type'].lower()}_kernel_time_pct"] = row["percentage"]
    total_us = kernels["sum (us)"].sum()
    named = kernels[kernels["name"] != "others"]
    top = named.groupby(["name", "kernel_type"])["sum (us)"].sum().nlargest(TOP_KERNELS)
    outcome.top_kernels = [
        {"name": name, "kernel_type": kind, "total_us": float(us), "pct_of_kernel_time": _pct(us, total_us)}
        for (name, kind), us in top.items()
    ]
    return outcome


def comm_comp_overlap(ctx: Context) -> AnalysisResult:
    table = ctx.analyzer.get_comm_comp_overlap(visualize=False)
    write_table(table, ctx.out_dir, "comm_comp_overlap")
    outcome = AnalysisResult()
    for row in table.to_dict("records"):
        rank, pct = int(row["rank"]), row["comp_comm_overlap_pctg"]
        if math.isfinite(pct):
            outcome.metrics[rank_metric(rank, "comm_comp_overlap_pct")] = pct
        else:
            outcome.warnings.append(f"rank {rank}: HTA found no communication kernels, overlap undefined")
    return outcome


def cuda_kernel_launch_stats(ctx: Context) -> AnalysisResult:
    import pandas as pd

    per_rank = ctx.analyzer.get_cuda_kernel_launch_stats(ranks=ctx.ranks, visualize=False)
    outcome = AnalysisResult()
    summaries = []
    for rank, launches in per_rank.items():
        durations = launches[["cpu_duration", "gpu_duration", "launch_delay"]]
        summary = durations.describe(percentiles=[0.5, 0.95]).T.rename_axis("duration_us").reset_index()
        summary.insert(0, "rank", rank)
        summaries.append(summary)
        if not launches.empty:
            delay = launches["launch_delay"]
            outcome.metrics[rank_metric(rank, "kernel_launch_delay_median_us")] = delay.median()
            outcome.metrics[rank_metric(rank, "kernel_launch_delay_p95_us")] = delay.quantile(0.95)
    write_table(pd.concat(summaries, ignore_index=True), ctx.out_dir, "cuda_kernel_launch_stats")
    return outcome


def queue_length_summary(ctx: Context) -> AnalysisResult:
    table = ctx.analyzer.get_queue_length_summary(ranks=ctx.ranks)
    if table is None:
        return AnalysisResult(warnings=["HTA found no CUDA launch queue events"])
    write_table(table, ctx.out_dir, "queue_length_summary")
    outcome = AnalysisResult()
    for rank, longest in table[("queue_length", "max")].groupby(level="rank").max().items():
        outcome.metrics[rank_metric(int(rank), "cuda_launch_queue_max")] = longest
    return outcome


def memory_bw_summary(ctx: Context) -> AnalysisResult:
    table = ctx.analyzer.get_memory_bw_summary(ranks=ctx.ranks)
    if table is None:
        return AnalysisResult(warnings=["HTA found no memcpy/memset bandwidth events"])
    write_table(table, ctx.out_dir, "memory_bw_summary")
    return AnalysisResult()


def critical_path(ctx: Context) -> AnalysisResult:
    """One profiler step of the lowest rank: HTA's graph grows with every event, so one step is the
    affordable unit, and the first step is skipped when there are others because it misses events."""
    rank = ctx.ranks[0]
    result = ctx.analyzer.critical_path_analysis(
        rank=rank, annotation="ProfilerStep", instance_id=ctx.critical_path_step
    )
    if result is None:
        raise RuntimeError("HTA found no ProfilerStep annotation to bound the critical path")
    graph, succeeded = result
    edges = graph.get_critical_path_breakdown() if succeeded else None
    if edges is None:
        raise RuntimeError("HTA could not find a critical path in this step")
    classified = edges[edges["bound_by"].fillna("") != ""]  # HTA leaves some zero-length edges unclassified
    bound_by = classified.groupby("bound_by")["duration"].sum().rename("duration_us").reset_index()
    bound_by["pct"] = (100 * bound_by["duration_us"] / bound_by["duration_us"].sum()).round(2)
    write_table(bound_by, ctx.out_dir, "critical_path_summary")
    shares = zip(bound_by["bound_by"], bound_by["pct"], strict=True)
    return AnalysisResult(metrics={rank_metric(rank, f"critical_path_{bound}_pct"): pct for bound, pct in shares})


ANALYSES: dict[str, Callable[[Context], AnalysisResult]] = {
    "temporal_breakdown": temporal_breakdown,
    "idle_time_breakdown": idle_time_breakdown,
    "gpu_kernel_breakdown": gpu_kernel_breakdown,
    "comm_comp_overlap": comm_comp_overlap,
    "cuda_kernel_launch_stats": cuda_kernel_launch_stats,
    "queue_length_summary": queue_length_summary,
    "memory_bw_summary": memory_bw_summary,
    "critical_path": critical_path,
}
ANALYSIS_NAMES = tuple(ANALYSES)


def rank_metric(rank: int, name: str) -> str:
    """A metric's key below `hta/` (`rank0/idle_pct`): this script runs without the package, so the runner puts
    the `names.HTA` prefix on every key it reads back."""
    return f"rank{rank}/{name}"


def write_table(table: pd.DataFrame, out_dir: Path, name: str) -> None:
    """CSV for spreadsheets, JSON records for programs; HTA's multi-level columns become `a_b`."""
    if name not in TABLE_NAMES:
        raise ValueError(f"unknown table {name!r}: add it to TABLE_NAMES")
    flat = table.copy()
    if flat.columns.nlevels > 1:
        flat.columns = ["_".join(str(part) for part in column if part) for column in flat.columns]
    if any(level is not None for level in flat.index.names):
        flat = flat.reset_index()
    flat.to_csv(out_dir / f"{name}.csv", index=False)
    flat.to_json(out_dir / f"{name}.json", orient="records", indent=1)


def run_plan(plan: dict[str, Any]) -> None:
    """Load the traces once, then run each planned analysis on its own, recording each result as it ends."""
    out_dir = Path(plan["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = out_dir / PROGRESS_FILE
    started = time.monotonic()
    try:
        analyzer = _load(plan)
    except Exception as error:
        traceback.print_exc()
        _record(progress, analysis=LOAD_STEP, status="failed", error=describe_error(error))
        return
    ranks = sorted(analyzer.t.get_ranks())
    _record(progress, analysis=LOAD_STEP, status="ran", seconds=_since(started), ranks=ranks)
    for warning in _load_warnings(plan, ranks):
        _record(progress, warning=warning)
    ctx = Context(analyzer, ranks, out_dir, int(plan.get("critical_path_step", 0)))
    for name in plan["analyses"]:
        started = time.monotonic()
        try:
            outcome = ANALYSES[name](ctx)
        except Exception as error:
            traceback.print_exc()
            error_line = describe_error(error)
            _record(progress, analysis=name, status="failed", error=error_line, seconds=_since(started))
            continue
        _record(
            progress,
            analysis=name,
            status="ran",
            seconds=_since(started),
            metrics=_finite(outcome.metrics),
            warnings=outcome.warnings,
            top_kernels=outcome.top_kernels,
        )


def describe_error(error: BaseException) -> str:
    """One line, with the HTA source line that raised: what a bug report needs."""
    message = f"{type(error).__name__}: {error}".rstrip(": ")
    location = _hta_location(error)
    return f"{message} (at {location})" if location else message


def _hta_location(error: BaseException) -> str | None:
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        parts = Path(frame.filename).parts
        if "hta" in parts:
            start = len(parts) - 1 - parts[::-1].index("hta")
            return f"{'/'.join(parts[start:])}:{frame.lineno}"
    return None


def _load(plan: dict[str, Any]) -> TraceAnalysis:
    from hta.trace_analysis import TraceAnalysis

    trace_files = {int(rank): path for rank, path in plan["trace_files"].items()}
    return TraceAnalysis(trace_files=trace_files, trace_dir=plan["folder"])


def misclassified_nccl_kernels(names: list[str]) -> list[str]:
    """NCCL kernels that HTA's name patterns do not count as communication (older HTA missed
    `ncclDevKernel_*`), which would understate communication time and overlap."""
    from hta.utils.utils import KernelType, get_kernel_type

    return [name for name in names if get_kernel_type(name) != KernelType.COMMUNICATION.name]


def _load_warnings(plan: dict[str, Any], loaded_ranks: list[int]) -> list[str]:
    warnings = []
    unloaded = sorted(set(map(int, plan["trace_files"])) - set(loaded_ranks))
    if unloaded:
        warnings.append(f"HTA found no analyzable events for ranks {unloaded}; they are left out")
    misread = misclassified_nccl_kernels(plan.get("nccl_kernel_names", []))
    if misread:
        warnings.append(
            f"HTA does not count {len(misread)} NCCL kernel name(s) as communication "
            f"(e.g. {misread[0][:80]!r}): communication time and overlap are understated"
        )
    return warnings


def _record(progress: Path, **entry: Any) -> None:
    with progress.open("a", encoding="utf-8") as stream:
        stream.write(json.dumps(entry, default=str) + "\n")


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items() if math.isfinite(float(value))}


def _pct(part: float, whole: float) -> float:
    return round(100 * float(part) / float(whole), 2) if whole else 0.0


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def main() -> None:
    run_plan(json.load(sys.stdin))


if __name__ == "__main__":
    main()
