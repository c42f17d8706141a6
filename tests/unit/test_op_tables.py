"""Operator tables from key_averages() objects and the time/memory report files built from them."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from anemoi_profiler.profiling.device_memory import export_memory_timeline
from anemoi_profiler.profiling.op_tables import (
    MEMORY_EXPLANATION,
    OperatorStats,
    WindowOperators,
    merge_windows,
    operator_stats,
    top_by_memory,
    top_by_time,
)
from anemoi_profiler.profiling.operator_reports import operator_sections, write_memory_report, write_time_report


def event(key: str, **values: float) -> SimpleNamespace:
    """A stand-in for FunctionEventAvg with torch >= 2.4 attribute names (device_*)."""
    names = (
        "self_cpu_time_total",
        "cpu_time_total",
        "self_device_time_total",
        "device_time_total",
        "self_cpu_memory_usage",
        "cpu_memory_usage",
        "self_device_memory_usage",
        "device_memory_usage",
        "flops",
    )
    return SimpleNamespace(key=key, count=values.pop("count", 1), **{n: values.get(n, 0) for n in names})


@pytest.fixture(scope="module")
def real_events() -> list:
    """key_averages() of 2 profiled training steps of a small MLP on CPU."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    x = torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    return list(prof.key_averages())


def test_stats_from_real_key_averages(real_events: list) -> None:
    operators = {op.name: op for op in operator_stats(real_events)}
    addmm = operators["aten::addmm"]
    assert addmm.calls == 4  # 2 layers x 2 steps
    assert addmm.cpu_total_ms >= addmm.self_cpu_ms > 0
    assert addmm.self_cpu_memory_mb > 0  # allocates its output
    assert operators["aten::linear"].cpu_total_ms >= addmm.cpu_total_ms / 2
    assert addmm.self_device_ms == 0 and addmm.device_memory_mb == 0  # CPU only


def test_old_torch_cuda_attribute_names_are_read() -> None:
    old = SimpleNamespace(
        key="aten::mm",
        count=2,
        self_cpu_time_total=1000.0,
        cpu_time_total=1500.0,
        self_cuda_time_total=4000.0,
        cuda_time_total=4000.0,
        self_cpu_memory_usage=0,
        cpu_memory_usage=0,
        self_cuda_memory_usage=-2_000_000,
        cuda_memory_usage=3_000_000,
        flops=10,
    )
    stats = OperatorStats.from_event(old)
    assert (stats.self_device_ms, stats.device_total_ms) == (4.0, 4.0)
    assert (stats.self_device_memory_mb, stats.device_memory_mb) == (-2.0, 3.0)
    assert stats.self_cpu_ms == 1.0


def test_the_whole_step_row_is_left_out() -> None:
    events = [event("ProfilerStep*", cpu_time_total=9e9), event("aten::mm", self_cpu_time_total=5.0)]
    assert [op.name for op in operator_stats(events)] == ["aten::mm"]


def test_time_table_keeps_the_top_of_every_ranking() -> None:
    events = [
        event("aten::linear", self_cpu_time_total=1, cpu_time_total=900, device_time_total=800),
        event("aten::addmm", self_cpu_time_total=50, cpu_time_total=60, self_device_time_total=700),
        event("aten::copy_", self_cpu_time_total=80, cpu_time_total=80, self_device_time_total=5),
        event("aten::view", self_cpu_time_total=2, cpu_time_total=2),
    ]
    chosen = [op.name for op in top_by_time(operator_stats(events), top_n=1, device=True)]
    # linear: top by CPU total and device total; copy_: top by self CPU; addmm: top by self device
    assert chosen == ["aten::addmm", "aten::copy_", "aten::linear"]  # sorted by self device time
    assert [op.name for op in top_by_time(operator_stats(events), top_n=1, device=False)] == [
        "aten::copy_",
        "aten::linear",
    ]


def test_memory_table_sorts_allocations_and_frees_by_size() -> None:
    events = [
        event("aten::empty", self_device_memory_usage=8e9, device_memory_usage=8e9),
        event("aten::native_layer_norm_backward", self_device_memory_usage=-9e9, device_memory_usage=1e9),
        event("aten::view"),
        event("aten::mm", self_device_memory_usage=1e6, device_memory_usage=1e6, self_cpu_memory_usage=5e9),
    ]
    device = [op.name for op in top_by_memory(operator_stats(events), top_n=10, device=True)]
    assert device == ["aten::native_layer_norm_backward", "aten::empty", "aten::mm"]  # no row that moves nothing
    assert [op.name for op in top_by_memory(operator_stats(events), top_n=1, device=False)] == ["aten::mm"]


def test_windows_merge_per_operator() -> None:
    first = WindowOperators("train", 0, 2, operator_stats([event("aten::mm", count=2, self_cpu_time_total=1000)]))
    second = WindowOperators("train", 1, 2, operator_stats([event("aten::mm", count=3, self_cpu_time_total=500)]))
    (merged,) = merge_windows([first, second])
    assert (merged.calls, merged.self_cpu_ms) == (5, 1.5)


def test_report_files(tmp_path: Path, real_events: list) -> None:
    windows = [WindowOperators("train", 0, 2, operator_stats(real_events))]
    hooks = {"train/backward": {"count": 2, "mean_ms": 1.0, "p50_ms": 1.0, "p90_ms": 1.2, "max_ms": 1.2}}
    write_time_report(tmp_path, windows, top_n=5, rank=0, hooks=hooks)
    write_memory_report(tmp_path, windows, top_n=5, rank=0, step_memory=None, timeline=None)

    with open(tmp_path / "time_report.csv") as file:
        rows = list(csv.DictReader(file))
    assert 5 <= len(rows) <= 10  # union of the top 5 by self and by total CPU time
    assert {row["stage"] for row in rows} == {"train"}
    assert "aten::addmm" in {row["operator"] for row in rows}
    assert json.loads((tmp_path / "time_report.json").read_text())["hooks"] == hooks

    text = (tmp_path / "memory_report.txt").read_text()
    assert text.startswith(MEMORY_EXPLANATION)
    assert "train window 0 (2 steps, rank 0)" in text
    assert "self CPU MB" in text and "self device MB" not in text  # no device columns on a CPU run
    with open(tmp_path / "memory_report.csv") as file:
        rows = list(csv.DictReader(line for line in file if not line.startswith("#")))
    assert len(rows) == 5
    assert float(rows[0]["self_cpu_mb"]) != 0
    assert json.loads((tmp_path / "memory_report.json").read_text())["explanation"] == MEMORY_EXPLANATION


def test_report_sections_explain_memory_once(real_events: list) -> None:
    windows = [
        WindowOperators("train", 0, 2, operator_stats(real_events)),
        WindowOperators("val", 0, 1, operator_stats(real_events)),
    ]
    sections = operator_sections(windows, top_n=3, rank=0)
    assert [s.title.split(" (")[0] for s in sections] == [
        "Operators by self CPU time",
        "Memory by operator",
        "Operators by self CPU time",
        "Memory by operator",
    ]
    assert sections[1].note == MEMORY_EXPLANATION and "see above" in sections[3].note
    assert all(len(s.rows) <= 3 for s in sections)


def test_memory_timeline_export_is_timed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Exporter:
        def __init__(self, writes: bool) -> None:
            self.writes = writes
            self.device = ""

        def export_memory_timeline(self, path: str, device: str) -> None:
            self.device = device
            if self.writes:
                Path(path).write_text("<html></html>")

    exporter = Exporter(writes=True)
    seconds = export_memory_timeline(exporter, tmp_path / "memory/timeline_rank0.html", torch.device("cuda", 1))
    assert seconds is not None and seconds >= 0
    assert exporter.device == "cuda:1"
    with caplog.at_level(logging.WARNING):
        assert export_memory_timeline(Exporter(writes=False), tmp_path / "t.html", torch.device("cuda")) is None
    assert "matplotlib" in caplog.text
