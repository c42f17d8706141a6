"""Line and bar charts written as SVG by hand: the report's plots, without a plotting library at the end of a run.

The report draws a few series of at most a few thousand points each. Writing their SVG takes milliseconds;
rasterising the same plots with matplotlib took 0.3-0.4 s at the end of every run, the largest part of what
a short run paid at its end (see docs/benchmarks.md). The browser lays out the text, and the same file opens
in report.html and in MLflow's artifact viewer. `to_matplotlib` draws a chart as a
matplotlib figure, for `mlflow.log_figure` or a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from html import escape
from itertools import cycle, groupby
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIDTH, HEIGHT = 640, 280
"""The drawing's size in CSS pixels (taller by a row for each extra row of legend); report.html scales it to the
page."""
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Matplotlib's default colours, so that a chart and its `to_matplotlib` figure look alike."""
LEVEL_COLOR = "#808080"
"""The dashed lines of `Chart.levels`."""
MARK_COLOR = "#d62728"
"""The dotted vertical lines of `Chart.marks`."""
MAX_MARKERS = 200
"""A line with more points than this is drawn without its point markers, which would blot it."""
FONT_PX = 12
_CHAR_PX = 0.6 * FONT_PX
"""About the width of one character of the legend, to lay its entries out in rows."""
_MARGIN = {"left": 70, "right": 16, "bottom": 44, "title": 26, "legend_row": 18}
_TICKS = 6
Scale = Callable[[float], float]
"""A data value to its SVG coordinate."""


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

    def colored(self) -> Iterator[tuple[Series, str]]:
        """Each series with its colour: its own, or the next of `COLORS`."""
        colors = cycle(COLORS)
        for series in self.series:
            yield series, series.color or next(colors)


def to_svg(chart: Chart) -> str:
    """The chart as a standalone SVG document."""
    colored = list(chart.colored())
    entries: list[tuple[str, Series | None, str]] = [(s.label, s, color) for s, color in colored]
    entries += [(label, None, LEVEL_COLOR) for label in chart.levels]
    rows = _legend_rows([label for label, _, _ in entries], WIDTH - _MARGIN["left"])
    top = _MARGIN["title"] + _MARGIN["legend_row"] * len(rows) + 8
    height = HEIGHT + _MARGIN["legend_row"] * max(0, len(rows) - 1)  # the plot keeps its height
    area = _Area(_MARGIN["left"], top, WIDTH - _MARGIN["right"], height - _MARGIN["bottom"])
    x_lo, x_hi = _x_range(chart)
    y_lo, y_hi = _y_range(chart)
    x_ticks, y_ticks = nice_ticks(x_lo, x_hi), nice_ticks(y_lo, y_hi)
    to_x = area.scale_x(x_lo, x_hi)
    to_y = area.scale_y(y_lo, y_hi)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'role="img" aria-label="{escape(chart.title)}" font-family="system-ui, -apple-system, Segoe UI, Roboto, '
        f'Helvetica, Arial, sans-serif" font-size="{FONT_PX}" fill="#1d2129">',
        f"<title>{escape(chart.title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
        f'<text x="{area.left}" y="17" font-size="13" font-weight="600">{escape(chart.title)}</text>',
    ]
    parts += _grid_and_axes(chart, area, x_ticks, y_ticks, to_x, to_y)
    for series, color in colored:
        parts += _draw(series, color, to_x, to_y)
    for label, value in chart.levels.items():
        y = _f(to_y(value))
        parts.append(
            f'<line x1="{area.left}" x2="{area.right}" y1="{y}" y2="{y}" stroke="{LEVEL_COLOR}" stroke-dasharray="6 4"'
            f' stroke-width="1.2"><title>{escape(label)}</title></line>'
        )
    for value, label in chart.marks:
        x = _f(to_x(value))
        parts.append(
            f'<line class="mark" x1="{x}" x2="{x}" y1="{area.top}" y2="{area.bottom}" stroke="{MARK_COLOR}" '
            f'stroke-dasharray="2 3" stroke-width="1.5"><title>{escape(label)}</title></line>'
        )
        parts.append(f'<text x="{_f(to_x(value) + 3)}" y="{area.top + 12}" fill="{MARK_COLOR}">{escape(label)}</text>')
    parts += _legend(rows, entries, _MARGIN["title"] + 4)
    parts.append("</svg>")
    return "\n".join(parts)


def to_matplotlib(chart: Chart) -> Figure:
    """The chart as a matplotlib figure (object API, no pyplot: no global state, no GUI backend)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH / 100, HEIGHT / 100), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(chart.title, loc="left", fontsize="medium")
    axes.grid(alpha=0.3)
    for series, color in chart.colored():
        if series.kind == "bars":
            axes.bar(series.x, series.y, series.widths or 0.8, bottom=series.bottom, align="edge", color=color,
                     label=series.label)  # fmt: skip
        elif series.kind == "ticks":
            axes.plot(series.x, series.y, "_", color=color, markersize=14, label=series.label)
        else:
            axes.plot(series.x, series.y, marker="o" if series.markers else None, color=color, label=series.label)
    for label, value in chart.levels.items():
        axes.axhline(value, color=LEVEL_COLOR, linestyle="--", label=label)
    for value, label in chart.marks:
        axes.axvline(value, color=MARK_COLOR, linestyle=":")
        axes.annotate(label, (value, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                      textcoords="offset points", color=MARK_COLOR, fontsize="small")  # fmt: skip
    axes.set_xlabel(chart.x_label)
    axes.set_ylabel(chart.y_label)
    axes.set_ylim(bottom=chart.y_min, top=chart.y_max)
    axes.legend(loc="best", fontsize="small")
    return figure


@dataclass(frozen=True)
class _Area:
    left: float
    top: float
    right: float
    bottom: float

    def scale_x(self, lo: float, hi: float) -> Scale:
        return lambda x: self.left + (x - lo) / (hi - lo) * (self.right - self.left)

    def scale_y(self, lo: float, hi: float) -> Scale:
        return lambda y: self.bottom - (y - lo) / (hi - lo) * (self.bottom - self.top)


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _x_range(chart: Chart) -> tuple[float, float]:
    xs: list[float] = []
    for series in chart.series:
        xs += series.x
        if series.kind == "bars" and series.widths:
            xs += [x + w for x, w in zip(series.x, series.widths, strict=True)]
    xs = _finite(xs + [value for value, _ in chart.marks])
    if not xs:
        return 0.0, 1.0
    lo, hi = min(xs), max(xs)
    pad = (hi - lo) * 0.03 or abs(hi) * 0.05 or 0.5
    return lo - pad, hi + pad


def _y_range(chart: Chart) -> tuple[float, float]:
    ys: list[float] = list(chart.levels.values())
    for series in chart.series:
        if series.kind == "bars":
            bottoms = series.bottom or [0.0] * len(series.y)
            ys += bottoms + [bottom + y for bottom, y in zip(bottoms, series.y, strict=True)]
        else:
            ys += series.y
    ys = _finite(ys)
    data_lo, data_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (data_hi - data_lo) * 0.05 or abs(data_hi) * 0.05 or 0.5
    lo = chart.y_min if chart.y_min is not None and chart.y_min <= data_lo else data_lo - pad
    hi = chart.y_max if chart.y_max is not None and chart.y_max >= data_hi else data_hi + pad
    return lo, hi


def nice_ticks(lo: float, hi: float) -> list[float]:
    """Round values from `lo` to `hi`, 1, 2, 2.5 or 5 times a power of ten apart: the step that gives the
    closest to `_TICKS` of them."""
    exponent = math.floor(math.log10((hi - lo) / _TICKS))
    steps = [m * 10.0**e for e in (exponent, exponent + 1) for m in (1, 2, 2.5, 5)]
    step = min(reversed(steps), key=lambda step: abs((hi - lo) / step - _TICKS))
    first = math.ceil(lo / step - 1e-9) * step
    count = math.floor((hi - first) / step + 1e-9) + 1
    return [round(first + i * step, 12) for i in range(count)]


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels for round tick values: as few decimals as their step needs; from 10,000 on, in k, M or G."""
    if not ticks:
        return []
    step = ticks[1] - ticks[0] if len(ticks) > 1 else abs(ticks[0]) or 1.0
    largest = max(abs(t) for t in ticks)
    scales = ((1e9, "G"), (1e6, "M"), (1e3, "k")) if largest >= 1e4 else ()
    factor, suffix = next(((f, s) for f, s in scales if largest >= f), (1.0, ""))
    step /= factor
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    return [f"{t / factor + 0.0:.{decimals}f}{suffix}" if t else "0" for t in ticks]  # + 0.0: never "-0"


def _grid_and_axes(
    chart: Chart, area: _Area, x_ticks: list[float], y_ticks: list[float], to_x: Scale, to_y: Scale
) -> list[str]:
    parts = []
    for tick, label in zip(y_ticks, tick_labels(y_ticks), strict=True):
        y = _f(to_y(tick))
        parts.append(f'<line x1="{area.left}" x2="{area.right}" y1="{y}" y2="{y}" stroke="#e3e6ea"/>')
        parts.append(f'<text x="{area.left - 6}" y="{y}" text-anchor="end" dominant-baseline="middle">{label}</text>')
    for tick, label in zip(x_ticks, tick_labels(x_ticks), strict=True):
        x = _f(to_x(tick))
        parts.append(f'<line x1="{x}" x2="{x}" y1="{area.top}" y2="{area.bottom}" stroke="#e3e6ea"/>')
        parts.append(f'<text x="{x}" y="{area.bottom + 16}" text-anchor="middle">{label}</text>')
    width, height = area.right - area.left, area.bottom - area.top
    parts.append(
        f'<rect x="{area.left}" y="{area.top}" width="{width}" height="{height}" fill="none" stroke="#9aa3ad"/>'
    )
    if chart.x_label:
        parts.append(
            f'<text x="{_f(area.left + width / 2)}" y="{_f(area.bottom + 36)}" text-anchor="middle">'
            f"{escape(chart.x_label)}</text>"
        )
    if chart.y_label:
        middle = _f(area.top + height / 2)
        parts.append(
            f'<text transform="translate(16 {middle}) rotate(-90)" text-anchor="middle">{escape(chart.y_label)}</text>'
        )
    return parts


def _draw(series: Series, color: str, to_x: Scale, to_y: Scale) -> list[str]:
    points = [(x, y) for x, y in zip(series.x, series.y, strict=True)]
    if series.kind == "bars":
        bottoms = series.bottom or [0.0] * len(points)
        widths = series.widths or [0.8] * len(points)
        parts = []
        for (x, y), bottom, width in zip(points, bottoms, widths, strict=True):
            if not (math.isfinite(x) and math.isfinite(y)) or y == 0:
                continue
            left, right = sorted((to_x(x), to_x(x + width)))
            upper, lower = sorted((to_y(bottom + y), to_y(bottom)))
            parts.append(
                f'<rect x="{_f(left)}" y="{_f(upper)}" width="{_f(right - left)}" height="{_f(lower - upper)}" '
                f'fill="{color}"/>'
            )
        return parts
    finite = [(to_x(x), to_y(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if series.kind == "ticks":
        return [
            f'<line x1="{_f(x - 7)}" x2="{_f(x + 7)}" y1="{_f(y)}" y2="{_f(y)}" stroke="{color}" stroke-width="2"/>'
            for x, y in finite
        ]
    parts = []
    for segment in _segments(points, to_x, to_y):
        coordinates = " ".join(f"{_f(x)},{_f(y)}" for x, y in segment)
        parts.append(f'<polyline points="{coordinates}" fill="none" stroke="{color}" stroke-width="1.6"/>')
    if series.markers and len(finite) <= MAX_MARKERS:
        parts += [f'<circle cx="{_f(x)}" cy="{_f(y)}" r="2.6" fill="{color}"/>' for x, y in finite]
    return parts


def _segments(points: list[tuple[float, float]], to_x: Scale, to_y: Scale) -> list[list[tuple[float, float]]]:
    """The line's runs of finite points (a missing value, NaN, breaks it, as in matplotlib), each thinned to
    what a pixel column can show."""
    segments: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if math.isfinite(x) and math.isfinite(y):
            segments[-1].append((to_x(x), to_y(y)))
        elif segments[-1]:
            segments.append([])
    return [_thinned(segment) for segment in segments if segment]


def _thinned(segment: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Per pixel column, the first, lowest, highest and last point: the line looks the same, and a day of
    system samples stays a file of kilobytes, not megabytes."""
    if len(segment) <= 4 * (WIDTH - _MARGIN["left"] - _MARGIN["right"]):
        return segment
    thinned: list[tuple[float, float]] = []
    for _, column in groupby(segment, key=lambda point: round(point[0])):
        points = list(column)
        kept = [points[0], min(points, key=lambda p: p[1]), max(points, key=lambda p: p[1]), points[-1]]
        thinned += sorted(set(kept), key=points.index)
    return thinned


def _legend_rows(labels: list[str], width: float) -> list[list[int]]:
    """The legend's entries (by index) in rows that fit `width`, in order."""
    rows: list[list[int]] = []
    used = width
    for index, label in enumerate(labels):
        entry = _legend_width(label)
        if used + entry > width:
            rows.append([])
            used = 0.0
        rows[-1].append(index)
        used += entry
    return rows


def _legend_width(label: str) -> float:
    """An entry's width: its sample (30 px with the gap), its label, the space before the next."""
    return 30 + len(label) * _CHAR_PX + 16


def _legend(rows: list[list[int]], entries: list[tuple[str, Series | None, str]], top: float) -> list[str]:
    parts = []
    for row_number, row in enumerate(rows):
        y = top + row_number * _MARGIN["legend_row"] + 6
        x = float(_MARGIN["left"])
        for index in row:
            label, series, color = entries[index]
            parts.append(_swatch(series, color, x, y))
            parts.append(f'<text x="{_f(x + 26)}" y="{_f(y)}" dominant-baseline="middle">{escape(label)}</text>')
            x += _legend_width(label)
    return parts


def _swatch(series: Series | None, color: str, x: float, y: float) -> str:
    """The legend's sample of a series (None: a level's dashed line)."""
    if series is None:
        return (
            f'<line x1="{_f(x)}" x2="{_f(x + 20)}" y1="{_f(y)}" y2="{_f(y)}" stroke="{color}" stroke-dasharray="5 3"/>'
        )
    if series.kind == "bars":
        return f'<rect x="{_f(x + 3)}" y="{_f(y - 5)}" width="14" height="10" fill="{color}"/>'
    line = f'<line x1="{_f(x)}" x2="{_f(x + 20)}" y1="{_f(y)}" y2="{_f(y)}" stroke="{color}" stroke-width="2"/>'
    if series.kind == "line" and series.markers:
        line += f'<circle cx="{_f(x + 10)}" cy="{_f(y)}" r="2.6" fill="{color}"/>'
    return line


def _f(value: float) -> str:
    """A coordinate with one decimal, no trailing zero: small files, exact enough on any screen."""
    return f"{value:.1f}".removesuffix(".0")
