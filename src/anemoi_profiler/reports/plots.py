"""The report's plots, drawn from `metrics.json`: throughput, step-time breakdown, peak memory, system metrics.

Built with matplotlib's object API (`Figure`, no pyplot): no global state, no GUI backend, safe from the
training process's threads. Each plot is drawn once, as a PNG, at the end of the run: report.html embeds it
and `<run folder>/plots/` keeps it for the MLflow run (drawing is most of the report's cost at the end of a
short run; a second drawing as SVG for the page doubled it).
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..layout import PLOTS_DIR
from .run_data import RunData, load_run

SIZE = (8.0, 3.2)
PNG_DPI = 120
CAPACITY_LINE_FROM = 0.2
"""The device's capacity is drawn as a line once the peak reaches this share of it (it is in the title anyway)."""
MAX_GPU_LINES = 4
"""More GPUs than this on a node are drawn as their mean, so the plot stays readable."""
_SYSTEM_PERCENT = re.compile(r"^system/(?:(?P<node>node_\d+)/)?(?P<name>.+)_percentage$")
_GPU = re.compile(r"^gpu_\d+_(?P<what>.+)$")
_SYSTEM_LEFT_OUT = ("disk_usage",)
"""Disk fullness is a constant, not behaviour."""


def throughput_figure(run: RunData) -> Figure | None:
    """Global samples/s (batches/s when samples are unknown) per log interval, training and validation."""
    figure, axes = new_figure("Throughput")
    units = []
    for stage in ("train", "val"):
        for unit in ("samples", "batches"):
            steps, values = run.series(f"throughput/{stage}/{unit}_per_sec")
            if steps:
                axes.plot(steps, values, marker="o", label=f"{stage} {unit}/s")
                units.append(unit)
                break
    if not units:
        return None
    axes.set_ylabel("/".join(dict.fromkeys(units)) + " per second")
    axes.set_xlabel("step")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best")
    return figure


def step_time_figure(run: RunData) -> Figure | None:
    """Training step time per log interval, split into dataloader wait and the rest (compute, framework)."""
    steps, step_ms = run.series("time/train/step_ms")
    if not steps:
        return None
    wait = dict(zip(*run.series("time/train/dataloader_wait_ms"), strict=True))
    waits = [min(wait.get(step, 0.0), total) for step, total in zip(steps, step_ms, strict=True)]
    rest = [total - waited for total, waited in zip(step_ms, waits, strict=True)]
    figure, axes = new_figure("Training step time per log interval")
    gaps = [b - a for a, b in pairwise(steps)]
    widths = [-0.95 * gap for gap in [gaps[0] if gaps else 1, *gaps]]  # each bar spans its interval
    axes.bar(steps, waits, widths, align="edge", label="dataloader wait", color="#d95f02")
    axes.bar(steps, rest, widths, bottom=waits, align="edge", label="rest of the step", color="#1b9e77")
    slowest_steps, slowest = run.series("time/train/step_ms_max")
    if slowest_steps:
        axes.plot(slowest_steps, slowest, "k_", markersize=14, label="slowest rank")
    axes.set_ylabel("ms per batch")
    axes.set_xlabel("step")
    axes.legend(loc="best")
    return figure


def memory_figure(run: RunData) -> Figure | None:
    """Peak device memory per log interval against the device's capacity, and the process's resident memory."""
    lines = {
        "memory/peak_allocated_mb": "GPU peak allocated",
        "memory/peak_reserved_mb": "GPU peak reserved",
        "memory/cpu_rss_mb": "process RSS (CPU)",
    }
    series = {label: run.series(key) for key, label in lines.items()}
    drawn = {label: points for label, points in series.items() if points[0]}
    if not drawn:
        return None
    capacity = run.device_memory_mb() if run.on_gpu else None
    title = "Peak memory per log interval" + (f" (device memory {capacity / 1e3:.1f} GB)" if capacity else "")
    figure, axes = new_figure(title)
    for label, (steps, values) in drawn.items():
        axes.plot(steps, [v / 1e3 for v in values], marker="o", label=label)
    peak = max(max(values) for _, values in drawn.values())
    if capacity and peak >= CAPACITY_LINE_FROM * capacity:  # else the line would flatten the curves
        axes.axhline(capacity / 1e3, color="grey", linestyle="--", label="device memory")
    axes.set_ylabel("GB")
    axes.set_xlabel("step")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best")
    return figure


def system_figure(run: RunData) -> Figure | None:
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
    figure, axes = new_figure("System metrics")
    for label, (times, values) in series.items():
        axes.plot([(t - start) / 60 for t in times], values, label=label)
    axes.set_ylabel("%")
    axes.set_xlabel("minutes since the first sample")
    axes.set_ylim(0, 105)
    axes.legend(loc="best", fontsize="small")
    return figure


FIGURES: dict[str, Callable[[RunData], Figure | None]] = {
    "throughput": throughput_figure,
    "step_time": step_time_figure,
    "memory": memory_figure,
    "system": system_figure,
}


def figures(run: RunData | Path) -> dict[str, Figure]:
    """The plots this run has data for, by name (a run folder or a loaded run)."""
    run = run if isinstance(run, RunData) else load_run(run)
    drawn = {name: draw(run) for name, draw in FIGURES.items()}
    return {name: figure for name, figure in drawn.items() if figure is not None}


def plot_images(run: RunData | Path) -> dict[str, bytes]:
    """The plots this run has data for, by name, as PNG bytes."""
    images = {}
    for name, figure in figures(run).items():
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=PNG_DPI)
        images[name] = buffer.getvalue()
    return images


def write_plot_images(run_dir: Path, images: dict[str, bytes] | None = None) -> list[Path]:
    """`<run folder>/plots/<name>.png` (drawn now unless `images` are given), uploaded with the run folder."""
    folder = Path(run_dir) / PLOTS_DIR
    written = []
    for name, image in (plot_images(run_dir) if images is None else images).items():
        folder.mkdir(exist_ok=True)
        written.append(folder / f"{name}.png")
        written[-1].write_bytes(image)
    return written


def svg_markup(figure: Figure, id_prefix: str) -> str:
    """The figure as an `<svg>` element for inline HTML: text as paths (no fonts needed), no XML prologue, and
    its ids prefixed, since several plots share one page and matplotlib numbers ids the same in each."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg") :], flags=re.DOTALL)
    text = re.sub(r'\bid="', f'id="{id_prefix}', text)
    return re.sub(r'(href="#|url\(#)', rf"\g<1>{id_prefix}", text)


def _label(name: str) -> str:
    """`system_memory_usage` -> `system memory`, `gpu_0_utilization` -> `gpu 0 utilisation`."""
    return name.replace("_usage", "").replace("_utilization", " utilisation").replace("_", " ")


def new_figure(title: str) -> tuple[Figure, Axes]:
    """A report-sized figure with one titled, gridded axes (also used by `compare`)."""
    figure = Figure(figsize=SIZE, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title, loc="left", fontsize="medium")
    axes.grid(alpha=0.3)
    return figure, axes


def _mean_series(series: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """Point-by-point mean of series sampled together (one sampler writes all GPUs at once)."""
    length = min(len(values) for _, values in series)
    times = series[0][0][:length]
    return times, [sum(values[i] for _, values in series) / len(series) for i in range(length)]
