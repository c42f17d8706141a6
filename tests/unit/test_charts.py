"""The report's charts, drawn by matplotlib: what each shows (title, axes, series, legend), the axis ends, and
the SVG document report.html and MLflow get."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from anemoi_profiler.reports.charts import HEIGHT, MAX_MARKERS, WIDTH, Chart, Series, to_figure, to_svg

SVG = "{http://www.w3.org/2000/svg}"


def svg_texts(svg: str) -> list[str]:
    """The text a reader sees in the SVG document."""
    return ["".join(element.itertext()) for element in ElementTree.fromstring(svg).iter(SVG + "text")]


def test_a_chart_is_a_standalone_matplotlib_svg_with_its_title_axes_and_legend() -> None:
    chart = Chart("Throughput", x_label="step", y_label="samples per second", y_min=0)
    chart.series += [
        Series("train samples/s", [10, 20, 30], [100.0, 300.0, 200.0], markers=True),
        Series("val samples/s", [15, 30], [250.0, 260.0], markers=True),
    ]
    svg = to_svg(chart)
    root = ElementTree.fromstring(svg)
    assert root.tag == SVG + "svg" and "Matplotlib" in svg  # its creator, in the metadata
    assert root.get("width") == f"{WIDTH * 3 / 4:g}pt" and root.get("height") == f"{HEIGHT * 3 / 4:g}pt"
    assert {"Throughput", "step", "samples per second", "train samples/s", "val samples/s"} <= set(svg_texts(svg))
    axes = to_figure(chart).axes[0]
    assert [line.get_label() for line in axes.get_lines()] == ["train samples/s", "val samples/s"]
    assert axes.get_lines()[0].get_xydata().tolist() == [[10, 100], [20, 300], [30, 200]]
    assert axes.get_lines()[0].get_marker() == "o"


def test_the_same_chart_gives_the_same_file() -> None:
    chart = Chart("Memory", series=[Series("rss", [1, 2, 3], [1.0, 2.0, 1.5])], marks=[(2, "window 0: drift")])
    svg = to_svg(chart)
    assert svg == to_svg(chart)  # fixed ids, no date: two reports of one run are equal
    assert "<dc:date>" not in svg and 'clip-path="url(#p' in svg


def test_fixed_axis_ends_give_way_to_data_beyond_them() -> None:
    within = Chart("System metrics", y_min=0, y_max=105, series=[Series("cpu", [0, 1], [50.0, 80.0])])
    assert to_figure(within).axes[0].get_ylim() == (0, 105)
    beyond = Chart("System metrics", y_min=0, y_max=105, series=[Series("cpu", [0, 1], [-10.0, 180.0])])
    low, high = to_figure(beyond).axes[0].get_ylim()
    assert low < -10 and high > 180


def test_stacked_bars_start_where_the_bars_below_end() -> None:
    chart = Chart("Step time", y_min=0)
    chart.series += [
        Series("wait", [10, 20], [1.0, 2.0], kind="bars", widths=[-9.5, -9.5]),
        Series("rest", [10, 20], [4.0, 3.0], kind="bars", widths=[-9.5, -9.5], bottom=[1.0, 2.0]),
        Series("slowest rank", [10, 20], [6.0, 5.5], kind="ticks"),
    ]
    axes = to_figure(chart).axes[0]
    wait, rest = axes.patches[:2], axes.patches[2:]
    for below, above in zip(wait, rest, strict=True):
        assert above.get_y() == pytest.approx(below.get_y() + below.get_height())
        assert above.get_x() == below.get_x() in (10, 20) and above.get_width() == -9.5  # each ends at its step
    (ticks,) = axes.get_lines()
    assert ticks.get_marker() == "_" and ticks.get_linestyle() == "None"
    assert svg_texts(to_svg(chart))[-3:] == ["wait", "rest", "slowest rank"]  # the legend, in the series' order


def test_names_are_text_in_the_svg_escaped() -> None:
    chart = Chart("<b>model</b> & co", series=[Series("rank <0>", [1, 2, 3, 4], [1.0, float("nan"), 2.0, 3.0])])
    svg = to_svg(chart)
    assert "<b>" not in svg and "&lt;b&gt;model&lt;/b&gt; &amp; co" in svg
    assert {"<b>model</b> & co", "rank <0>"} <= set(svg_texts(svg))


def test_degenerate_charts_still_draw() -> None:
    for chart in (
        Chart("empty"),
        Chart("one point", series=[Series("a", [5], [7.0], markers=True)]),
        Chart("flat zero", series=[Series("a", [0, 0], [0.0, 0.0])], levels={"device memory": 0.0}, y_min=0),
    ):
        assert chart.title in svg_texts(to_svg(chart))


def test_a_level_is_a_dashed_line_in_the_legend() -> None:
    chart = Chart("Peak memory", y_label="GB", y_min=0, levels={"device memory": 80.0})
    chart.series.append(Series("allocated", [1, 2], [10.0, 20.0], markers=True))
    axes = to_figure(chart).axes[0]
    level = axes.get_lines()[-1]
    assert level.get_linestyle() == "--" and list(level.get_ydata()) == [80.0, 80.0]
    assert axes.get_ylim()[1] > 80
    assert {"allocated", "device memory"} <= set(svg_texts(to_svg(chart)))


def test_a_long_legend_makes_the_drawing_taller_in_rows() -> None:
    many = Chart("System metrics", series=[Series(f"node_{i} gpu {i} utilisation", [0, 1], [1, 2]) for i in range(8)])
    one = Chart("System metrics", series=many.series[:1])
    assert to_figure(one).get_size_inches()[1] * 96 == HEIGHT
    assert to_figure(many).get_size_inches()[1] * 96 > HEIGHT
    assert sum(text.startswith("node_") for text in svg_texts(to_svg(many))) == 8


def test_a_long_series_drops_its_markers_and_stays_a_small_file() -> None:
    steps = list(range(100_000))
    values = [float(step % 100) for step in steps]
    values[54_321] = 1000.0  # one spike among a day of samples
    chart = Chart("System metrics", series=[Series("cpu", steps, values, markers=True)])
    (line,) = to_figure(chart).axes[0].get_lines()
    assert line.get_marker() in ("None", None) and len(steps) > MAX_MARKERS
    assert len(to_svg(chart)) < 150_000  # matplotlib simplifies the path to what the drawing can show


def test_a_mark_is_a_labelled_vertical_line_at_its_x() -> None:
    chart = Chart("Step time", x_label="step", y_min=0, marks=[(150, "window 0: drift")])
    chart.series.append(Series("step", [0, 100, 200], [10.0, 10.0, 13.0]))
    axes = to_figure(chart).axes[0]
    mark = axes.get_lines()[-1]
    assert list(mark.get_xdata()) == [150, 150] and mark.get_linestyle() == ":"
    assert [text.get_text() for text in axes.texts] == ["window 0: drift"]
    assert "window 0: drift" in svg_texts(to_svg(chart))
