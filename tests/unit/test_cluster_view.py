"""The cluster's view of the nodes' system samples, their exchange rows, and the run folder's per-node tables as
the report and `compare` read them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from anemoi_profiler import names
from anemoi_profiler.cluster.system_nodes import decode, encode, row_length
from anemoi_profiler.reports.cluster_view import cluster_view, nodes_section
from anemoi_profiler.reports.compare import compare_runs
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.system_tables import NodeSample, SystemTableWriter, read_node_means, read_system_table


def node(index: int, cpu: float, gpus: dict[int, float] | None = None, step: int = 40) -> NodeSample:
    sample = NodeSample(index, step, 1000.0 + index, {"cpu_utilization_percentage": cpu, "disk_usage_percentage": 50.0})
    for ordinal, utilization in (gpus or {}).items():
        sample.gpus[ordinal] = {"utilization_percentage": utilization, "temperature_celsius": 60.0 + ordinal}
    return sample


def test_node_figures_give_min_median_max_and_the_node_farthest_from_the_median() -> None:
    view = cluster_view([node(0, 80.0), node(1, 82.0), node(2, 20.0), node(3, 81.0), node(4, 79.0)])
    assert view[names.cluster("cpu_utilization_percentage", "min")] == 20.0
    assert view[names.cluster("cpu_utilization_percentage", "median")] == 80.0
    assert view[names.cluster("cpu_utilization_percentage", "max")] == 82.0
    assert view[names.cluster("cpu_utilization_percentage", "outlier_node")] == 2.0
    # Every node alike: no outlier is named, rather than blaming node 0 or logging a made-up -1.
    assert names.cluster("disk_usage_percentage", "median") in view
    assert names.cluster("disk_usage_percentage", "outlier_node") not in view
    assert names.cluster("gpu_utilization_percentage", "min") not in view  # no GPU, no GPU figures


def test_gpu_figures_span_every_gpu_of_every_node_and_name_the_outliers_node_and_gpu() -> None:
    view = cluster_view([node(0, 50.0, {0: 95.0, 1: 96.0}), node(1, 50.0, {0: 94.0, 1: 31.0})])
    assert view[names.cluster("gpu_utilization_percentage", "min")] == 31.0
    assert view[names.cluster("gpu_utilization_percentage", "median")] == pytest.approx(94.5)
    assert view[names.cluster("gpu_utilization_percentage", "max")] == 96.0
    assert (
        view[names.cluster("gpu_utilization_percentage", "outlier_node")],
        view[names.cluster("gpu_utilization_percentage", "outlier_gpu")],
    ) == (1.0, 1.0)
    # Equal distances from the median: the first node, then the first GPU, is named.
    assert view[names.cluster("gpu_temperature_celsius", "outlier_node")] == 0.0
    assert view[names.cluster("gpu_temperature_celsius", "outlier_gpu")] == 0.0


def test_the_number_of_series_does_not_depend_on_the_number_of_nodes_or_gpus() -> None:
    two = cluster_view([node(k, 50.0 + k, {g: 90.0 - g - k for g in range(2)}) for k in range(2)])
    many = cluster_view([node(k, 50.0 + k, {g: 90.0 - g for g in range(8)}) for k in range(125)])
    assert sorted(two) == sorted(many)
    # cpu and disk for the nodes, GPU utilisation and temperature for the GPUs; disk alike everywhere: no outlier
    assert len(two) == 2 * len(names.CLUSTER_STATISTICS) - 1 + 2 * (len(names.CLUSTER_STATISTICS) + 1)


def test_a_sample_is_read_from_the_samplers_names_and_given_back_under_node_names() -> None:
    metrics = {
        names.system("cpu_utilization_percentage"): 12.5,
        names.gpu(3, "power_usage_watts"): 250.0,
        names.system("something_else"): 1.0,  # not a figure of the tables: left out
    }
    sample = NodeSample.of_metrics(2, 10, 5.0, metrics)
    assert sample.values == {"cpu_utilization_percentage": 12.5}
    assert sample.gpus == {3: {"power_usage_watts": 250.0}}
    assert sample.metrics("node_2") == {
        names.system("cpu_utilization_percentage", "node_2"): 12.5,
        names.system("gpu_3_power_usage_watts", "node_2"): 250.0,
    }


def test_exchange_rows_carry_the_samples_and_pad_with_nan() -> None:
    samples = [node(1, 10.0, {0: 90.0}, step=8), node(1, 11.0, {0: 91.0, 5: 70.0}, step=12)]
    payload = encode(samples, rows=3, gpu_slots=2)
    assert len(payload) == 3 * row_length(2)
    assert all(math.isnan(value) for value in payload[2 * row_length(2) :])
    back = decode(payload, gpu_slots=2, host="n1")
    assert [(s.node, s.step, s.host) for s in back] == [(1, 8, "n1"), (1, 12, "n1")]
    assert [s.values for s in back] == [s.values for s in samples]
    assert [s.gpus for s in back] == [s.gpus for s in samples]
    assert decode(encode([], rows=2, gpu_slots=2), gpu_slots=2) == []  # a rank with nothing to send


def test_the_per_node_tables_are_appended_and_read_back(tmp_path: Path) -> None:
    writer = SystemTableWriter(tmp_path)
    writer.append([node(0, 80.0, {0: 95.0, 1: 96.0}, step=4), node(1, 20.0, {0: 30.0}, step=4)])
    writer.append([node(0, 81.0, {0: 97.0, 1: 98.0}, step=8)])
    nodes, gpus = read_system_table(tmp_path)
    assert nodes["node"] == [0, 1, 0] and nodes["step"] == [4, 4, 8]
    assert nodes["cpu_utilization_percentage"] == [80.0, 20.0, 81.0]
    assert nodes["network_receive_megabytes"] == [None, None, None]  # not sampled: empty cells
    assert list(zip(gpus["node"], gpus["gpu"], gpus["utilization_percentage"], strict=True)) == [
        (0, 0, 95.0),
        (0, 1, 96.0),
        (1, 0, 30.0),
        (0, 0, 97.0),
        (0, 1, 98.0),
    ]
    with (tmp_path / "system_metrics" / "gpus.csv").open("a") as file:
        file.write("1,host,0,12")  # a row cut short by a killed run
    assert len(read_system_table(tmp_path)[1]["gpu"]) == 5
    assert read_system_table(tmp_path / "elsewhere") == (
        {column: [] for column in nodes},
        {column: [] for column in gpus},
    )


def test_node_means_stream_from_the_tables_and_give_the_reports_view(tmp_path: Path) -> None:
    writer = SystemTableWriter(tmp_path)
    writer.append([node(0, 80.0, {0: 90.0, 1: 92.0}), node(1, 70.0, {0: 40.0, 1: 91.0})])
    writer.append([node(0, 84.0, {0: 94.0, 1: 96.0}), node(1, 74.0, {0: 44.0, 1: 95.0})])
    means = {sample.node: sample for sample in read_node_means(tmp_path)}
    assert means[0].values["cpu_utilization_percentage"] == 82.0
    assert means[1].gpus == {0: {"utilization_percentage": 42.0, "temperature_celsius": 60.0},
                             1: {"utilization_percentage": 93.0, "temperature_celsius": 61.0}}  # fmt: skip

    section = nodes_section(list(means.values()))
    assert section is not None
    rows = {row[0]: row[1:] for row in section.rows}
    assert rows["GPU utilisation (%)"] == ["42.0", "92.5", "94.0", "node 1, GPU 0"]
    assert nodes_section([means[0]]) is not None  # one node, two GPUs: they can differ
    assert nodes_section([NodeSample(0, -1, 0.0, {"cpu_utilization_percentage": 5.0})]) is None


def test_compare_reads_the_gpu_utilisation_of_both_runs_from_their_tables(tmp_path: Path) -> None:
    runs = []
    for name, idle_gpu in (("a", 90.0), ("b", 30.0)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "metrics.json").write_text("{}")
        SystemTableWriter(folder).append([node(0, 50.0, {0: 95.0, 1: idle_gpu})])
        runs.append(load_run(folder))
    differences = {d.label: d for d in compare_runs(*runs).metrics}
    lowest = differences["GPU utilisation, lowest GPU"]
    assert (lowest.a, lowest.b, lowest.status) == (90.0, 30.0, "regression")
