"""The operator reports: `time_report.{csv,json}`, `memory_report.{txt,csv,json}` and their report sections.

Files hold every window of this rank (one row per stage, window and operator); the report sections sum a
stage's windows, so the console shows one table per stage however many windows ran.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.profiling.device_memory import StepMemory
from anemoi_profiler.profiling.op_tables import (
    MEMORY_EXPLANATION,
    OperatorStats,
    WindowOperators,
    memory_row,
    merge_windows,
    time_row,
    top_by_memory,
    top_by_time,
)
from anemoi_profiler.profiling.traces import traces_mb
from anemoi_profiler.profiling.windows import MAX_TABLED_WINDOWS, ProfilingWindows
from anemoi_profiler.report_sections import ReportSection, format_value, plain_table
from anemoi_profiler.run_files.layout import MEMORY_REPORT, TIME_REPORT, TRACES_DIR

_WINDOW_COLUMNS = ("stage", "window", "steps", "rank")
_TIME_CELLS = {"self_cpu_ms": "self CPU ms", "cpu_total_ms": "CPU total ms"}
_DEVICE_TIME_CELLS = {"self_device_ms": "self device ms", "device_total_ms": "device total ms"}
_MEMORY_CELLS = {"self_cpu_mb": "self CPU MB", "cpu_total_mb": "total CPU MB"}
_DEVICE_MEMORY_CELLS = {"self_device_mb": "self device MB", "device_total_mb": "total device MB"}

Selector = Callable[[list[OperatorStats], int, bool], list[OperatorStats]]
RowMaker = Callable[[OperatorStats], dict[str, Any]]


def summarize_windows(windows: ProfilingWindows, traces_note: str) -> tuple[list[ReportSection], dict[str, float]]:
    """Write this rank's report files; return the report sections and `summary/profiler/...` metrics."""
    options = windows.options
    memory = options.memory_report and options.profile_memory  # without profile_memory every value is 0
    hooks = windows.durations.summary()
    if options.time_report and (windows.operator_tables or hooks):
        write_time_report(windows.run_dir, windows.operator_tables, options.top_n, windows.rank, hooks)
    if memory and windows.operator_tables:
        write_memory_report(
            windows.run_dir,
            windows.operator_tables,
            options.top_n,
            windows.rank,
            windows.step_memory,
            _timeline(windows),
        )
    overview, metrics = _overview(windows, traces_note)
    for name, stats in hooks.items():
        metrics[names.profiler_summary(f"{name}_ms")] = stats["mean_ms"]
    sections = [
        overview,
        *operator_sections(windows.operator_tables, options.top_n, windows.rank, options.time_report, memory),
        hook_section(hooks),
    ]
    return [section for section in sections if section is not None], metrics


# ---- files ----
def write_time_report(
    run_dir: Path, windows: list[WindowOperators], top_n: int, rank: int, hooks: dict[str, dict[str, Any]]
) -> list[Path]:
    """Per window, the `top_n` operators by self and total CPU and device time, plus Lightning hook durations."""
    tables = _window_tables(windows, top_n, rank, top_by_time, time_row)
    csv_path, json_path = run_dir / f"{TIME_REPORT}.csv", run_dir / f"{TIME_REPORT}.json"
    _write_csv(csv_path, tables)
    document = {"rank": rank, "top_n": top_n, "unit": "ms", "windows": tables, "hooks": hooks}
    json_path.write_text(json.dumps(document, indent=2))
    return [csv_path, json_path]


def write_memory_report(
    run_dir: Path,
    windows: list[WindowOperators],
    top_n: int,
    rank: int,
    step_memory: StepMemory | None,
    timeline: dict[str, Any] | None,
) -> list[Path]:
    """Per window, the operators allocating or freeing the most memory, with the explanation in each file."""
    tables = _window_tables(windows, top_n, rank, top_by_memory, memory_row)
    txt_path, csv_path, json_path = paths = [run_dir / f"{MEMORY_REPORT}.{suffix}" for suffix in ("txt", "csv", "json")]
    txt_path.write_text(_memory_text(tables))
    _write_csv(csv_path, tables, comment=MEMORY_EXPLANATION)
    document = {
        "explanation": MEMORY_EXPLANATION,
        "rank": rank,
        "unit": "MB",
        "windows": tables,
        "profiled_steps": {"totals": step_memory.totals(), "steps": step_memory.steps} if step_memory else None,
        "memory_timeline": timeline,
    }
    json_path.write_text(json.dumps(document, indent=2))
    return paths


def _window_tables(
    windows: Iterable[WindowOperators], top_n: int, rank: int, select: Selector, make_row: RowMaker
) -> list[dict[str, Any]]:
    return [
        {
            "stage": w.stage,
            "window": w.window,
            "steps": w.steps,
            "rank": rank,
            "device": w.has_device,
            "operators": [make_row(op) for op in select(w.operators, top_n, w.has_device)],
        }
        for w in windows
    ]


def _write_csv(path: Path, tables: list[dict[str, Any]], comment: str = "") -> None:
    """One row per window and operator; `comment` goes first as `# ` lines (pandas: `comment="#"`)."""
    rows = [{**{key: t[key] for key in _WINDOW_COLUMNS}, **operator} for t in tables for operator in t["operators"]]
    with open(path, "w", newline="") as file:
        file.writelines(f"# {line}".rstrip() + "\n" for line in comment.splitlines())
        if rows:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def _memory_text(tables: list[dict[str, Any]]) -> str:
    lines = [MEMORY_EXPLANATION]
    for table in tables:
        title = f"{table['stage']} window {table['window']} ({table['steps']} steps, rank {table['rank']})"
        columns, cells = _cells(table["operators"], _memory_cells(table["device"]))
        lines += ["", title, "-" * len(title), *plain_table(columns, cells)]
    return "\n".join(lines) + "\n"


def _timeline(windows: ProfilingWindows) -> dict[str, Any] | None:
    if windows.timeline_seconds is None:
        return None
    return {"path": str(windows.timeline_path.relative_to(windows.run_dir)), "seconds": windows.timeline_seconds}


# ---- report sections ----
def operator_sections(
    windows: list[WindowOperators], top_n: int, rank: int, time: bool = True, memory: bool = True
) -> list[ReportSection]:
    """Per stage, operators by self time and by memory, summed over the stage's windows."""
    sections = []
    explained = False
    for stage in dict.fromkeys(w.stage for w in windows):
        stage_windows = [w for w in windows if w.stage == stage]
        device = any(w.has_device for w in stage_windows)
        operators = merge_windows(stage_windows)
        scope = f"{stage}, rank {rank}, {len(stage_windows)} window(s), {sum(w.steps for w in stage_windows)} steps"
        if time:
            primary = "self_device_ms" if device else "self_cpu_ms"
            busiest = sorted(operators, key=lambda o: getattr(o, primary), reverse=True)[:top_n]
            rows = [time_row(op) for op in busiest]
            columns, cells = _cells(rows, {**_TIME_CELLS, **(_DEVICE_TIME_CELLS if device else {})})
            title = f"Operators by self {'device' if device else 'CPU'} time ({scope})"
            sections.append(ReportSection(title, columns, cells, {"operators": rows}))
        if memory:
            rows = [memory_row(op) for op in top_by_memory(operators, top_n, device)]
            columns, cells = _cells(rows, _memory_cells(device))
            note = MEMORY_EXPLANATION if not explained else "Net allocations summed over calls and steps (see above)."
            explained = True
            sections.append(ReportSection(f"Memory by operator ({scope})", columns, cells, {"operators": rows}, note))
    return sections


def hook_section(hooks: dict[str, dict[str, Any]]) -> ReportSection | None:
    """Lightning hook durations measured by the callback over the profiling cycles."""
    if not hooks:
        return None
    rows = [
        [name, stats["count"], *(format_value(stats[key]) for key in ("mean_ms", "p50_ms", "p90_ms", "max_ms"))]
        for name, stats in hooks.items()
    ]
    note = (
        "Host time between Lightning hooks over the profiling cycles (wait, warmup and active batches); active "
        "batches include the profiler's own overhead. Without a device sync, GPU work can end in a later hook."
    )
    columns = ["hook", "count", "mean ms", "p50 ms", "p90 ms", "max ms"]
    return ReportSection("Lightning hooks in profiling windows", columns, rows, hooks, note)


def _memory_cells(device: bool) -> dict[str, str]:
    return {**(_DEVICE_MEMORY_CELLS if device else {}), **_MEMORY_CELLS}


def _cells(rows: list[dict[str, Any]], numbers: dict[str, str]) -> tuple[list[str], list[list[Any]]]:
    """Columns and formatted cells of operator rows: name, calls, then the chosen numbers."""
    columns = ["operator", "calls", *numbers.values()]
    return columns, [[row["operator"], row["calls"], *(format_value(float(row[k])) for k in numbers)] for row in rows]


def _overview(windows: ProfilingWindows, traces_note: str) -> tuple[ReportSection, dict[str, float]]:
    values: dict[str, tuple[Any, str]] = {}
    metrics: dict[str, float] = {}
    for stage, count in windows.completed.items():
        values[f"{stage} windows"] = (count, "")
        metrics[names.profiler_summary(f"windows/{stage}")] = count
    trace_mb = traces_mb(windows.run_dir)
    if trace_mb:
        values["traces"] = (f"{format_value(trace_mb, 'MB')} in {TRACES_DIR}/, {traces_note}", "")
        metrics[names.profiler_summary("trace_mb")] = trace_mb
    if windows.without_operator_rows:
        shown = ", ".join(f"{stage} {window}" for stage, window in windows.without_operator_rows[:3])
        more = f" and {len(windows.without_operator_rows) - 3} more" if len(windows.without_operator_rows) > 3 else ""
        values["windows without operator tables"] = (
            f"{shown}{more}: the time and memory reports cover a rank's first {MAX_TABLED_WINDOWS} windows; "
            "every operator of the others is in their traces",
            "",
        )
    if windows.traces is not None and windows.traces.skipped:
        values["traces not written (too large)"] = (", ".join(windows.traces.skipped), "")
    if windows.step_memory is not None and windows.step_memory.measured:
        totals = windows.step_memory.totals()
        values["profiled steps: peak allocated"] = (totals["peak_allocated_mb"], "MB")
        values["profiled steps: peak reserved"] = (totals["peak_reserved_mb"], "MB")
        values["profiled steps: allocation retries"] = (totals["alloc_retries"], "")
        values["profiled steps: OOMs"] = (totals["ooms"], "")
        metrics.update({names.profiler_summary(key): float(value) for key, value in totals.items()})
    if windows.timeline_seconds is not None:
        path = windows.timeline_path.relative_to(windows.run_dir)
        values["memory timeline"] = (f"{path}, exported in {windows.timeline_seconds:.1f} s", "")
        metrics[names.profiler_summary("memory_timeline_s")] = windows.timeline_seconds
    if not values:
        values["windows"] = ("none completed", "")
    return ReportSection.key_values("Torch profiler", values), metrics
