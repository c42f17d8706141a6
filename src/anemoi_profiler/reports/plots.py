"""The report's plots, drawn from `metrics.json`: throughput, step-time breakdown, peak memory, system metrics.

Each plot is a `charts.Chart`, what it shows kept apart from how it is drawn: report.html embeds the very SVG
files that `<run folder>/plots/` keeps for the MLflow run, and `figures` gives the same plots as matplotlib
figures (for `mlflow.log_figure` or a notebook).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from anemoi_profiler import names
from anemoi_profiler.reports.charts import Chart, Series, to_figure, to_svg
from anemoi_profiler.reports.run_data import RunData, load_run
from anemoi_profiler.run_files.layout import PLOTS_DIR

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CAPACITY_LINE_FROM = 0.2
"""The device's capacity is drawn as a line once the peak reaches this share of it (it is in the title anyway)."""
MAX_GPU_LINES = 4
"""More GPUs than this on a node are drawn as their mean, so the plot stays readable."""
_SYSTEM_PERCENT = re.compile(r"^system/(?:(?P<node>node_\d+)/)?(?P<name>.+)_percentage$")
_GPU = re.compile(r"^gpu_\d+_(?P<what>.+)$")
_SYSTEM_LEFT_OUT = ("disk_usage",)
"""Disk fullness is a constant, not behaviour."""


def throughput_chart(run: RunData) -> Chart | None:
    """Global samples/s (batches/s when samples are unknown) per log interval, training and validation."""
    chart = Chart("Throughput", x_label="step", y_min=0)
    units = []
    for stage in ("train", "val"):
        for unit in ("samples", "batches"):
            steps, values = run.series(names.throughput(stage, f"{unit}_per_sec"))
            if steps:
                chart.series.append(Series(f"{stage} {unit}/s", steps, values, markers=True))
                units.append(unit)
                break
    if not units:
        return None
    chart.y_label = "/".join(dict.fromkeys(units)) + " per second"
    return chart


def step_time_chart(run: RunData) -> Chart | None:
    """Training step time per log interval, split into dataloader wait and the rest (compute, framework)."""
    steps, step_ms = run.series(names.TRAIN_STEP_MS)
    if not steps:
        return None
    wait = dict(zip(*run.series(names.TRAIN_DATALOADER_WAIT_MS), strict=True))
    waits = [min(wait.get(step, 0.0), total) for step, total in zip(steps, step_ms, strict=True)]
    rest = [total - waited for total, waited in zip(step_ms, waits, strict=True)]
    gaps = [b - a for a, b in pairwise(steps)]
    widths = [-0.95 * gap for gap in [gaps[0] if gaps else 1, *gaps]]  # each bar spans its interval
    chart = Chart("Training step time per log interval", x_label="step", y_label="ms per batch", y_min=0)
    chart.series += [
        Series("dataloader wait", steps, waits, kind="bars", color="#d95f02", widths=widths),
        Series("rest of the step", steps, rest, kind="bars", color="#1b9e77", widths=widths, bottom=waits),
    ]
    slowest_steps, slowest = run.series(names.TRAIN_STEP_MS_MAX)
    if slowest_steps:
        chart.series.append(Series("slowest rank", slowest_steps, slowest, kind="ticks", color="#000000"))
    chart.marks = window_marks(run)
    return chart


def window_marks(run: RunData) -> list[tuple[float, str]]:
    """The start and reason of each triggered or requested training window (the report's list of them), on the
    plot's axis of global steps (a run folder from before `start_step` was recorded: its start batch)."""
    return [
        (
            window["start_batch"] if window.get("start_step") is None else window["start_step"],
            f"window {window['window']}: {window['reason']}",
        )
        for window in run.profiling_windows()
        if window.get("stage") == "train"
        and window.get("reason") != "schedule"
        and window.get("start_batch") is not None
    ]


def memory_chart(run: RunData) -> Chart | None:
    """Peak device memory per log interval against the device's capacity, and the process's resident memory."""
    lines = {
        names.PEAK_ALLOCATED_MB: "GPU peak allocated",
        names.PEAK_RESERVED_MB: "GPU peak reserved",
        names.CPU_RSS_MB: "process RSS (CPU)",
    }
    series = {label: run.series(key) for key, label in lines.items()}
    drawn = {label: points for label, points in series.items() if points[0]}
    if not drawn:
        return None
    capacity = run.device_memory_mb() if run.on_gpu else None
    title = "Peak memory per log interval" + (f" (device memory {capacity / 1e3:.1f} GB)" if capacity else "")
    chart = Chart(title, x_label="step", y_label="GB", y_min=0)
    for label, (steps, values) in drawn.items():
        chart.series.append(Series(label, steps, [v / 1e3 for v in values], markers=True))
    peak = max(max(values) for _, values in drawn.values())
    if capacity and peak >= CAPACITY_LINE_FROM * capacity:  # else the line would flatten the curves
        chart.levels["device memory"] = capacity / 1e3
    return chart


def system_chart(run: RunData) -> Chart | None:
    """CPU, host memory and GPU utilisation over wall time (percentages)."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    gpu_groups: dict[str, list[str]] = {}
    for key in sorted(run.metrics):
        match = _SYSTEM_PERCENT.match(key)
        if not match or match["name"] in _SYSTEM_LEFT_OUT:
            continue
        node = f"{match['node']} " if match["node"] else ""
        label = node + _label(match["name"])
        series[label] = (run.wall_times(key), run.series(key)[1])
        gpu = _GPU.match(match["name"])
        if gpu:
            gpu_groups.setdefault(f"{node}GPU mean {_label(gpu['what'])}", []).append(label)
    for mean_label, labels in gpu_groups.items():
        if len(labels) > MAX_GPU_LINES:
            series[mean_label] = _mean_series([series.pop(label) for label in labels])
    if not series:
        return None
    start = min(times[0] for times, _ in series.values() if times)
    chart = Chart("System metrics", x_label="minutes since the first sample", y_label="%", y_min=0, y_max=105)
    for label, (times, values) in series.items():
        chart.series.append(Series(label, [(t - start) / 60 for t in times], values))
    return chart


CHARTS: dict[str, Callable[[RunData], Chart | None]] = {
    "throughput": throughput_chart,
    "step_time": step_time_chart,
    "memory": memory_chart,
    "system": system_chart,
}


def charts(run: RunData | Path) -> dict[str, Chart]:
    """The plots this run has data for, by name (a run folder or a loaded run)."""
    run = run if isinstance(run, RunData) else load_run(run)
    drawn = {name: draw(run) for name, draw in CHARTS.items()}
    return {name: chart for name, chart in drawn.items() if chart is not None}


def figures(run: RunData | Path) -> dict[str, Figure]:
    """The same plots as matplotlib figures, by name."""
    return {name: to_figure(chart) for name, chart in charts(run).items()}


def plot_svgs(run: RunData | Path) -> dict[str, str]:
    """The plots this run has data for, by name, as SVG documents."""
    return {name: to_svg(chart) for name, chart in charts(run).items()}


def write_plot_files(run_dir: Path, svgs: dict[str, str] | None = None) -> list[Path]:
    """`<run folder>/plots/<name>.svg` (drawn now unless `svgs` are given), uploaded with the run folder."""
    folder = Path(run_dir) / PLOTS_DIR
    written = []
    for name, svg in (plot_svgs(run_dir) if svgs is None else svgs).items():
        folder.mkdir(exist_ok=True)
        written.append(folder / f"{name}.svg")
        written[-1].write_text(svg, encoding="utf-8")
    return written


def _label(name: str) -> str:
    """`system_memory_usage` -> `system memory`, `gpu_0_utilization` -> `gpu 0 utilisation`."""
    return name.replace("_usage", "").replace("_utilization", " utilisation").replace("_", " ")


def _mean_series(series: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """Point-by-point mean of series sampled together (one sampler writes all GPUs at once)."""
    length = min(len(values) for _, values in series)
    times = series[0][0][:length]
    return times, [sum(values[i] for _, values in series) / len(series) for i in range(length)]
