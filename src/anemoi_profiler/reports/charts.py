"""Line and bar charts, drawn by matplotlib: the report's plots in report.html, `plots/*.svg` and notebooks.

A `Chart` says what a plot shows (title, axes, series, levels, marks); `to_figure` draws it and `to_svg`
writes that figure as an SVG document. One renderer for every place a plot appears, so they cannot drift
apart. Drawing uses a `Figure` with its own SVG canvas, never pyplot: no global figure registry, no GUI
backend, no display needed, nothing rasterised. SVG rather than PNG because it stays sharp at any zoom,
its text is text, and the same file opens in report.html and in MLflow's artifact viewer.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, cast

if TYPE_CHECKING:  # matplotlib is imported by the first plot drawn, not by the CLI that imports this module
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.container import BarContainer
    from matplotlib.figure import Figure

WIDTH, HEIGHT = 640, 280
"""The drawing's size in CSS pixels (taller by a row for each extra row of legend); report.html scales it to the
page."""
PX_PER_INCH = 96
"""CSS pixels per inch: an SVG `width="480pt"` is drawn 640 pixels wide."""
LEVEL_COLOR = "#808080"
"""The dashed lines of `Chart.levels`."""
MARK_COLOR = "#d62728"
"""The dotted vertical lines of `Chart.marks`."""
MAX_MARKERS = 200
"""A line with more points than this is drawn without its point markers, which would blot it."""
LEGEND_ROW_PX = 18
_CHAR_PX = 6.5
"""About the width of one character of the legend, to lay its entries out in columns."""


@dataclass
class Series:
    """One series: a line (with point markers), bars from `bottom` (each `widths` wide from its x, a negative
    width ending at it), or short horizontal ticks (a value per interval, such as the slowest rank's)."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    kind: Literal["line", "bars", "ticks"] = "line"
    markers: bool = False
    color: str | None = None
    bottom: list[float] | None = None
    widths: list[float] | None = None


@dataclass
class Chart:
    """A titled chart of series against one x axis; `y_min`/`y_max` fix the y axis's ends (data beyond them
    still shows), `levels` are labelled dashed lines across it (a device's capacity, say) and `marks` labelled
    vertical lines at x values (where a triggered profiling window starts, say)."""

    title: str
    x_label: str = ""
    y_label: str = ""
    series: list[Series] = field(default_factory=list)
    levels: dict[str, float] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)
    y_min: float | None = None
    y_max: float | None = None


def to_svg(chart: Chart) -> str:
    """The chart as a standalone SVG document, the same for the same chart."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    figure = to_figure(chart)
    buffer = io.StringIO()
    # text as text (small files, selectable, searchable), ids from a fixed salt (one run, one file); matplotlib
    # reads both from its rcParams while it writes
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "anemoi-profiler"}):
        FigureCanvasSVG(figure).print_svg(buffer, metadata={"Date": None})
    return buffer.getvalue()


def to_figure(chart: Chart) -> Figure:
    """The chart as a matplotlib figure, for `to_svg`, `mlflow.log_figure` or a notebook."""
    from matplotlib.figure import Figure

    labels = [s.label for s in chart.series] + list(chart.levels)
    columns = max(1, min(len(labels), int(WIDTH // (30 + _CHAR_PX * max(map(len, labels), default=0)))))
    rows = math.ceil(len(labels) / columns)
    height = HEIGHT + LEGEND_ROW_PX * max(0, rows - 1)  # the plot keeps its height
    figure = Figure(figsize=(WIDTH / PX_PER_INCH, height / PX_PER_INCH), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(chart.title, loc="left", fontsize="medium", fontweight="bold")
    axes.grid(alpha=0.3)
    drawn = [_draw(axes, series) for series in chart.series]
    drawn += [axes.axhline(value, color=LEVEL_COLOR, linestyle="--", linewidth=1.2) for value in chart.levels.values()]
    for value, label in chart.marks:
        axes.axvline(value, color=MARK_COLOR, linestyle=":", linewidth=1.5)
        axes.annotate(label, (value, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                      textcoords="offset points", color=MARK_COLOR, fontsize="small")  # fmt: skip
    axes.set_xlabel(chart.x_label)
    axes.set_ylabel(chart.y_label)
    axes.ticklabel_format(useOffset=False)  # steps as steps, not "+1.2e4" beside the axis
    _fix_y_ends(axes, chart)
    if labels:
        handles = cast("list[Artist]", drawn)  # a BarContainer is a legend handle too, whatever the stubs say
        figure.legend(handles, labels, loc="outside lower left", ncols=columns, fontsize="small", frameon=False)
    return figure


def _draw(axes: Axes, series: Series) -> Artist | BarContainer:
    """The series on `axes`; what its legend entry shows."""
    if series.kind == "bars":
        return axes.bar(series.x, series.y, series.widths or 0.8, bottom=series.bottom, align="edge",
                        color=series.color, label=series.label)  # fmt: skip
    if series.kind == "ticks":
        (ticks,) = axes.plot(series.x, series.y, "_", markersize=14, markeredgewidth=2, color=series.color,
                             label=series.label)  # fmt: skip
        return ticks
    marker = "o" if series.markers and len(series.x) <= MAX_MARKERS else None
    (line,) = axes.plot(series.x, series.y, marker=marker, markersize=3.5, color=series.color, label=series.label)
    return line


def _fix_y_ends(axes: Axes, chart: Chart) -> None:
    """`y_min`/`y_max` where the data lies within them; matplotlib's own ends otherwise."""
    data_lo, data_hi = axes.dataLim.intervaly
    if not (math.isfinite(data_lo) and math.isfinite(data_hi)):
        return
    lo, hi = axes.get_ylim()
    if chart.y_min is not None and chart.y_min <= data_lo:
        lo = chart.y_min
    if chart.y_max is not None and chart.y_max >= data_hi:
        hi = chart.y_max
    if lo < hi:
        axes.set_ylim(lo, hi)
