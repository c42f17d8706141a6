"""The report's charts, written as SVG by hand: where the data lands, the axes, labels and what is left out."""

from __future__ import annotations

import math
import re
from xml.etree import ElementTree

import pytest

from anemoi_profiler.reports.charts import HEIGHT, WIDTH, Chart, Series, nice_ticks, tick_labels, to_matplotlib, to_svg

SVG = "{http://www.w3.org/2000/svg}"


def elements(chart: Chart, tag: str) -> list[ElementTree.Element]:
    return list(ElementTree.fromstring(to_svg(chart)).iter(SVG + tag))


def texts(chart: Chart) -> list[str]:
    return [element.text or "" for element in elements(chart, "text")]


def points(polyline: ElementTree.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (pair.split(",") for pair in polyline.get("points", "").split())]


def test_ticks_are_round_numbers_labelled_with_the_decimals_they_need() -> None:
    assert nice_ticks(0, 15_500) == [0, 2500, 5000, 7500, 10_000, 12_500, 15_000]
    assert tick_labels(nice_ticks(0, 15_500)) == ["0", "2.5k", "5.0k", "7.5k", "10.0k", "12.5k", "15.0k"]
    assert tick_labels(nice_ticks(0, 0.023)) == ["0", "0.005", "0.010", "0.015", "0.020"]
    assert tick_labels(nice_ticks(-1.2, 1.2)) == ["-1.0", "-0.5", "0", "0.5", "1.0"]
    assert tick_labels([0, 2e6, 4e6]) == ["0", "2M", "4M"]


def test_a_line_goes_up_with_its_values_and_spans_the_plot_area() -> None:
    chart = Chart("Throughput", x_label="step", y_label="samples/s", y_min=0)
    chart.series.append(Series("train", [10, 20, 30], [100.0, 300.0, 200.0], markers=True))
    (line,) = elements(chart, "polyline")
    (x1, y1), (x2, y2), (x3, y3) = points(line)
    assert x1 < x2 < x3 and y2 < y3 < y1  # SVG's y grows downwards: the highest value is nearest the top
    assert x1 > 0 and x3 < WIDTH and y2 > 0 and y1 < HEIGHT
    assert len(elements(chart, "circle")) == 3 + 1  # its points, and the legend's sample
    shown = texts(chart)
    assert {"Throughput", "step", "samples/s", "train", "0"} <= set(shown)


def test_fixed_axis_ends_give_way_to_data_beyond_them() -> None:
    chart = Chart("System metrics", y_min=0, y_max=105)
    chart.series.append(Series("cpu", [0, 1], [50.0, 180.0]))
    (frame,) = [r for r in elements(chart, "rect") if r.get("fill") == "none"]
    (line,) = elements(chart, "polyline")
    assert min(y for _, y in points(line)) > float(frame.get("y"))  # inside the plot area, not above it
    y_labels = [float(t) for t in texts(chart) if re.fullmatch(r"[0-9.]+", t)]
    assert max(y_labels) > 105 and min(y_labels) == 0


def test_stacked_bars_start_where_the_bars_below_end() -> None:
    chart = Chart("Step time", y_min=0)
    chart.series += [
        Series("wait", [10, 20], [1.0, 2.0], kind="bars", widths=[-9.5, -9.5]),
        Series("rest", [10, 20], [4.0, 3.0], kind="bars", widths=[-9.5, -9.5], bottom=[1.0, 2.0]),
    ]
    bars = [r for r in elements(chart, "rect") if r.get("fill") not in ("#fff", "none")][:-2]  # the legend's last
    wait, rest = bars[:2], bars[2:]
    for below, above in zip(wait, rest, strict=True):
        assert math.isclose(float(above.get("y")) + float(above.get("height")), float(below.get("y")), abs_tol=0.11)
        assert float(above.get("x")) == float(below.get("x"))  # one bar per interval, ending at its step


def test_a_missing_value_breaks_the_line_and_labels_are_escaped() -> None:
    chart = Chart("<b>model</b> & co")
    chart.series.append(Series("rank <0>", [1, 2, 3, 4], [1.0, float("nan"), 2.0, 3.0]))
    assert [len(points(line)) for line in elements(chart, "polyline")] == [1, 2]
    svg = to_svg(chart)
    assert "<b>" not in svg and "&lt;b&gt;model&lt;/b&gt; &amp; co" in svg and "rank &lt;0&gt;" in svg


def test_degenerate_charts_still_draw() -> None:
    for chart in (
        Chart("empty"),
        Chart("one point", series=[Series("a", [5], [7.0], markers=True)]),
        Chart("flat zero", series=[Series("a", [0, 0], [0.0, 0.0])], levels={"device memory": 0.0}),
    ):
        root = ElementTree.fromstring(to_svg(chart))
        assert root.get("viewBox") == f"0 0 {WIDTH} {HEIGHT}" and chart.title in texts(chart)


def test_a_long_legend_wraps_into_rows_above_the_plot() -> None:
    chart = Chart("System metrics")
    chart.series += [Series(f"node_{i} gpu {i} utilisation", [0, 1], [1.0, 2.0]) for i in range(8)]
    legend_rows = {t.get("y") for t in elements(chart, "text") if (t.text or "").startswith("node_")}
    assert len(legend_rows) > 1
    (frame,) = [r for r in elements(chart, "rect") if r.get("fill") == "none"]
    one_row = Chart("System metrics", series=chart.series[:1])
    (one_row_frame,) = [r for r in elements(one_row, "rect") if r.get("fill") == "none"]
    assert frame.get("height") == one_row_frame.get("height")  # the drawing grows, the plot keeps its height


def test_the_same_chart_as_a_matplotlib_figure() -> None:
    chart = Chart("Peak memory", x_label="step", y_label="GB", y_min=0, levels={"device memory": 141.0})
    chart.series += [
        Series("allocated", [1, 2], [10.0, 20.0], markers=True),
        Series("wait", [1, 2], [1.0, 2.0], kind="bars", widths=[-0.9, -0.9]),
    ]
    axes = to_matplotlib(chart).axes[0]
    assert axes.get_title(loc="left") == "Peak memory" and axes.get_ylabel() == "GB"
    assert [line.get_label() for line in axes.get_lines()] == ["allocated", "device memory"]
    assert len(axes.patches) == 2 and axes.get_ylim()[0] == 0


def test_a_long_series_is_thinned_to_what_the_pixels_show_and_keeps_its_extremes() -> None:
    steps = list(range(100_000))
    values = [float(step % 100) for step in steps]
    values[54_321] = 1000.0  # one spike among a day of samples
    chart = Chart("System metrics", series=[Series("cpu", steps, values)])
    (line,) = elements(chart, "polyline")
    drawn = points(line)
    assert len(drawn) <= 4 * WIDTH and len(to_svg(chart)) < 100_000
    (frame,) = [r for r in elements(chart, "rect") if r.get("fill") == "none"]
    top, bottom = float(frame.get("y")), float(frame.get("y")) + float(frame.get("height"))
    highest, lowest = min(y for _, y in drawn), max(y for _, y in drawn)
    assert highest - top < 0.05 * (bottom - top) and bottom - lowest < 0.05 * (bottom - top)  # spike and floor
    assert [x for x, _ in drawn] == sorted(x for x, _ in drawn)


def test_a_mark_is_a_labelled_vertical_line_at_its_x() -> None:
    chart = Chart("Step time", x_label="step", y_min=0, marks=[(150, "window 0: drift")])
    chart.series.append(Series("step", [0, 100, 200], [10.0, 10.0, 13.0]))
    (mark,) = [line for line in elements(chart, "line") if line.get("class") == "mark"]
    (line,) = elements(chart, "polyline")
    (x_100, _), (x_200, _) = points(line)[1:]
    assert float(mark.get("x1")) == float(mark.get("x2")) == pytest.approx((x_100 + x_200) / 2, abs=0.1)
    assert float(mark.get("y1")) < float(mark.get("y2"))
    assert "window 0: drift" in texts(chart)
    axes = to_matplotlib(chart).axes[0]
    assert [text.get_text() for text in axes.texts] == ["window 0: drift"]
