"""The window summary's sweep on hand-built windows with known answers, and the streaming trace reader."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from anemoi_profiler.analysis.preflight import trace_rank
from anemoi_profiler.profiling import trace_stream
from anemoi_profiler.profiling.kernel_kinds import RULE_NAMES, classify_device
from anemoi_profiler.profiling.torch_private import kineto_events_have_activity_type
from anemoi_profiler.profiling.trace_stream import TraceReadError, read_window_events
from anemoi_profiler.profiling.window_events import DEVICE, HOST, LAUNCH, STEP, WindowEventsBuilder
from anemoi_profiler.profiling.window_summary import (
    FIELD_NAMES,
    VECTOR_LENGTH,
    WindowSummary,
    name_hash,
    summarize,
    union_us,
)
from anemoi_profiler.profiling.window_table import WindowTable

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


GEMM = "sm90_xmma_gemm_bf16"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def two_stream_window() -> WindowSummary:
    """One 100 us step: a GEMM 10-40 us (stream 7) and an all-reduce 30-60 (stream 20), a memcpy 70-75, a GEMM
    80-90 launched at 85 (after the memcpy ended: host wait), a GEMM 95-97 (gap 5 us, launched early: kernel wait)."""
    events = WindowEventsBuilder()
    events.add("ProfilerStep#3", STEP, 0.0, 100.0)
    events.add("aten::mm", HOST, 1.0, 90.0)
    events.add("gloo:all_reduce", HOST, 50.0, 10.0)
    for correlation, (name, launch_at, start, dur, stream) in enumerate(
        [
            (GEMM, 2.0, 10.0, 30.0, 7),
            (ALL_REDUCE, 3.0, 30.0, 30.0, 20),
            ("Memcpy HtoD (Pinned -> Device)", 4.0, 70.0, 5.0, 7),
            (GEMM, 85.0, 86.0, 4.0, 7),
            (GEMM, 86.0, 95.0, 2.0, 7),
        ]
    ):
        events.add("cudaLaunchKernel", LAUNCH, launch_at, 1.0, correlation=correlation)
        events.add(name, DEVICE, start, dur, stream=stream, correlation=correlation)
    events.add(GEMM, DEVICE, 98.0, 1.0, stream=7, correlation=99)  # no launch in the window: left out, as HTA does
    return summarize(events.build())


def test_the_sweep_gives_the_figures_worked_out_by_hand() -> None:
    summary = two_stream_window()
    values = summary.values
    assert values["window_ms"] == pytest.approx(0.1)
    assert values["steps"] == 1
    assert values["device_events"] == 5
    assert values["streams"] == 2
    assert values["device_span_ms"] * 1e3 == pytest.approx(87.0)  # 10 to 97
    # busy: 10-60, 70-75, 86-90, 95-97 = 50 + 5 + 4 + 2
    assert values["active_ms"] * 1e3 == pytest.approx(61.0)
    assert values["idle_pct"] == pytest.approx(100 * 26 / 87)
    assert values["compute_ms"] * 1e3 == pytest.approx(36.0)
    assert values["communication_ms"] * 1e3 == pytest.approx(30.0)
    assert values["memory_ms"] * 1e3 == pytest.approx(5.0)
    assert values["overlap_ms"] * 1e3 == pytest.approx(10.0)  # 30-40
    assert values["overlap_pct"] == pytest.approx(100 * 10 / 30)
    assert values["exposed_communication_ms"] * 1e3 == pytest.approx(20.0)
    # HTA's kernel type breakdown: of the 61 us of kernels, compute alone 26 (10-30, 86-90, 95-97), communication
    # alone 20 (40-60), memory alone 5; the other 10 overlap
    assert values["kernel_ms"] * 1e3 == pytest.approx(61.0)
    assert values["computation_only_pct"] == pytest.approx(100 * 26 / 61)
    assert values["communication_only_pct"] == pytest.approx(100 * 20 / 61)
    assert values["memory_only_pct"] == pytest.approx(100 * 5 / 61)
    # stream 7: 40->70 (launched at 4: other), 75->86 (launched at 85 > 75: host wait), 90->95 (kernel wait)
    assert values["idle_host_wait_ms"] * 1e3 == pytest.approx(11.0)
    assert values["idle_kernel_wait_ms"] * 1e3 == pytest.approx(5.0)
    assert values["idle_other_ms"] * 1e3 == pytest.approx(30.0)
    assert values["idle_host_wait_pct"] == pytest.approx(100 * 11 / 46)
    # launch delays (start - launch end): 7, 26, 65, 0, 8
    assert values["launch_delay_p50_us"] == pytest.approx(8.0)
    assert values["launch_delay_p95_us"] == pytest.approx(np.percentile([7, 26, 65, 0, 8], 95))
    assert values["host_collective_ms"] * 1e3 == pytest.approx(10.0)
    assert values["launches"] == 5
    top = summary.top_kernels
    assert [(kernel.name, kernel.count) for kernel in top] == [(GEMM, 3), (ALL_REDUCE, 1), (top[2].name, 1)]
    assert top[0].share_pct == pytest.approx(100 * 36 / 71)
    assert summary.rules["rule_nccl_prefix_events"] == 1
    assert summary.rules["rule_memcpy_events"] == 1
    assert summary.rules["rule_compute_events"] == 3
    assert summary.rules["rule_host_collective_events"] == 1


@pytest.mark.parametrize(
    ("name", "kind", "rule"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float", "communication", "nccl_prefix"),
        ("ncclDevKernel_AllGather_RING_LL", "communication", "nccl_prefix"),
        ("void ncclKernel_SendRecv(ncclDevComm*)", "communication", "ncclKernel_inside"),
        ("Memset (Device)", "memory", "memset"),
        ("Memcpy DtoH (Device -> Pageable)", "memory", "memcpy"),
        ("void at::native::vectorized_elementwise_kernel<4>", "compute", "compute"),
        ("cudaStreamSynchronize", "other", "not_compute"),
    ],
)
def test_each_kernel_name_is_classified_by_htas_rules_and_says_which(name: str, kind: str, rule: str) -> None:
    from anemoi_profiler.profiling.kernel_kinds import KIND_NAMES

    kind_index, rule_index = classify_device(name)
    assert (KIND_NAMES[kind_index], RULE_NAMES[rule_index]) == (kind, rule)


def test_union_merges_overlapping_touching_and_nested_intervals() -> None:
    start = np.array([5.0, 0.0, 1.0, 20.0, 21.0, 30.0])
    end = np.array([12.0, 10.0, 2.0, 30.0, 22.0, 31.0])
    assert union_us(start, end) == pytest.approx(23.0)
    assert union_us(np.empty(0), np.empty(0)) == 0.0
    rng = np.random.default_rng(3)
    start = rng.integers(0, 5000, 600_000).astype(float)  # past the sweep's chunk size; many ties
    end = start + rng.integers(0, 4, len(start))
    covered = np.zeros(5004, dtype=bool)
    for first, last in zip(start.astype(int), end.astype(int), strict=True):
        covered[first:last] = True
    assert union_us(start, end) == covered.sum()
    assert union_us(start + 1.7e15, end + 1.7e15) == covered.sum()  # epoch-scale timestamps, as in real traces


def test_a_cpu_only_window_has_host_figures_and_device_fields_not_assessed(fixtures_dir: Path) -> None:
    summary = summarize(read_window_events(fixtures_dir / "traces" / "cpu_only" / "rank-34.pt.trace.json.gz"))
    values = summary.values
    assert not summary.device_assessed
    assert math.isnan(values["idle_pct"]) and math.isnan(values["overlap_pct"]) and summary.top_kernels == []
    assert values["steps"] == 1 and values["window_ms"] > 100
    assert 0 < values["host_busy_pct"] <= 100
    assert 0 < values["host_collective_pct"] <= 100  # gloo's all_reduce, cut to the window
    assert summary.vector().shape == (VECTOR_LENGTH,) == two_stream_window().vector().shape
    table = WindowTable.of({34: summary})
    assert "not assessed" in table.format_text()
    assert table.to_json()["ranks"][0]["idle_pct"] is None


def test_the_vector_carries_kernel_names_as_exact_hashes() -> None:
    summary = two_stream_window()
    vector = summary.vector()
    assert vector[: len(FIELD_NAMES)].tolist() == [summary.values[name] for name in FIELD_NAMES]
    assert name_hash(GEMM) < 2**48 and float(int(name_hash(GEMM))) == name_hash(GEMM)
    table = WindowTable.of({0: summary, 1: summary})
    assert table.top_kernels(1)[0]["name"] == GEMM
    assert table.spread("idle_pct").median == pytest.approx(summary.values["idle_pct"])


def test_streaming_reader_equals_a_whole_file_load_at_any_chunk_size(
    fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fixtures_dir / "traces" / "hta_sampled_2rank" / "sampled_rank-1.json.gz"
    whole = WindowEventsBuilder()
    with gzip.open(path, "rt") as file:
        for event in json.load(file)["traceEvents"]:
            whole.add_chrome_event(event)
    expected = whole.build()
    monkeypatch.setattr(trace_stream, "_CHUNK_CHARS", 97)  # boundaries fall inside keys, strings and numbers
    streamed = read_window_events(path)
    assert streamed.names == expected.names
    for column in ("name_id", "kind", "start_us", "dur_us", "stream", "correlation"):
        assert np.array_equal(getattr(streamed, column), getattr(expected, column)), column
    assert trace_rank(path) == 1


def test_a_trace_cut_short_or_not_a_trace_is_named(tmp_path: Path) -> None:
    cut = tmp_path / "rank3.json"
    cut.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}, {"ph": "X", "na')
    with pytest.raises(TraceReadError, match="cut short"):
        read_window_events(cut)
    other = tmp_path / "other.json"
    other.write_text('{"events": []}')
    with pytest.raises(TraceReadError, match="no traceEvents"):
        read_window_events(other)
    assert trace_rank(cut) == 3


@pytest.mark.skipif(
    not kineto_events_have_activity_type(),
    reason="torch < 2.12 tells no event's activity type: windows are read from the trace kineto saves (next test)",
)
def test_torchs_own_events_give_the_figures_of_the_trace_torch_exports(tmp_path: Path) -> None:
    """The in-process path (kineto's results, no file) and `summarize`'s path (the exported trace) agree."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from anemoi_profiler.profiling.kineto_events import window_events_from_kineto

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                torch.ones(64, 64).matmul(torch.ones(64, 64)).sum()
    from_torch = summarize(window_events_from_kineto(prof.profiler.kineto_results))
    prof.export_chrome_trace(str(tmp_path / "rank0.json"))
    from_file = summarize(read_window_events(tmp_path / "rank0.json"))
    assert from_torch.values["steps"] == from_file.values["steps"] == 3
    assert from_torch.values["window_ms"] == pytest.approx(from_file.values["window_ms"], rel=1e-3)
    assert from_torch.values["host_busy_pct"] == pytest.approx(from_file.values["host_busy_pct"], abs=0.5)
    assert not from_torch.device_assessed and not from_file.device_assessed


def test_the_window_kineto_saves_gives_the_figures_of_the_in_process_read() -> None:
    """torch < 2.12 has no `_KinetoEvent.activity_type`: there the window is read from the trace kineto saves (once
    per window: on such a torch this read is the only one), and agrees with the in-process read where both exist."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from anemoi_profiler.profiling.kineto_events import window_events_from_kineto, window_events_from_saved

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                torch.ones(64, 64).matmul(torch.ones(64, 64)).sum()
    saved = summarize(window_events_from_saved(prof.profiler.kineto_results))
    assert saved.values["steps"] == 3
    assert 0 < saved.values["host_busy_pct"] <= 100
    if not kineto_events_have_activity_type():
        return
    in_process = summarize(window_events_from_kineto(prof.profiler.kineto_results))
    assert saved.values["steps"] == in_process.values["steps"]
    # The trace keeps times to the microsecond's fraction kineto writes: this 0.2 ms window once moved by 0.3 us.
    assert saved.values["window_ms"] == pytest.approx(in_process.values["window_ms"], abs=1e-3)
    assert saved.values["host_busy_pct"] == pytest.approx(in_process.values["host_busy_pct"], abs=0.5)


class _KinetoEvent:
    """What `window_events_from_kineto` reads of torch's `_KinetoEvent`: device events need CUDA, absent here."""

    def __init__(self, category: str, name: str, start_ns: int, dur_ns: int, stream: int = 0, correlation: int = 0):
        self._fields = (category, name, start_ns, dur_ns, stream, correlation)

    def activity_type(self) -> str:
        return self._fields[0]

    def name(self) -> str:
        return self._fields[1]

    def start_ns(self) -> int:
        return self._fields[2]

    def duration_ns(self) -> int:
        return self._fields[3]

    def device_resource_id(self) -> int:
        return self._fields[4]

    def correlation_id(self) -> int:
        return self._fields[5]


def test_kineto_columns_are_the_trace_readers_columns_for_device_work() -> None:
    """Kernels, memcpys, launches (one without correlation id: dropped), memory instants (skipped), operators,
    steps and collectives read from torch's event objects give the trace reader's columns and figures."""
    from anemoi_profiler.profiling.kineto_events import window_events_from_kineto

    epoch_ns = 1_796_395_767_632_215_793  # ns since 1970: exact in int64, not in float64
    events = [
        _KinetoEvent("user_annotation", "ProfilerStep#0", epoch_ns, 100_000),
        _KinetoEvent("cpu_op", "aten::mm", epoch_ns + 1_000, 90_000, stream=17),
        _KinetoEvent("user_annotation", "gloo:all_reduce", epoch_ns + 50_000, 10_000),
        _KinetoEvent("cuda_runtime", "cudaLaunchKernel", epoch_ns + 2_000, 3_000, correlation=11),
        _KinetoEvent("cuda_runtime", "cudaStreamSynchronize", epoch_ns + 60_000, 1_000),
        _KinetoEvent("cuda_driver", "cuLaunchKernel", epoch_ns + 20_000, 2_000, correlation=12),
        _KinetoEvent("[memory]", "[memory]", epoch_ns + 5_000, 0),
        _KinetoEvent("kernel", GEMM, epoch_ns + 10_000, 30_000, stream=7, correlation=11),
        _KinetoEvent("kernel", ALL_REDUCE, epoch_ns + 30_000, 30_500, stream=20, correlation=12),
        _KinetoEvent("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", epoch_ns + 70_000, 5_000, stream=7),
    ]
    expected = WindowEventsBuilder()
    for event in events:
        category, name, start_ns, dur_ns, stream, correlation = event._fields
        expected.add_categorised(category, name, start_ns / 1e3, dur_ns / 1e3, stream, correlation or -1)
    expected_columns = expected.build()

    columns = window_events_from_kineto(type("Results", (), {"events": lambda self: events})())

    assert list(columns.kind) == [STEP, HOST, HOST, LAUNCH, LAUNCH, DEVICE, DEVICE, DEVICE]
    for column in ("kind", "start_us", "dur_us", "stream", "correlation"):
        assert np.array_equal(getattr(columns, column), getattr(expected_columns, column)), column
    named = columns.kind != LAUNCH  # launches are matched by correlation id alone: their names are not read
    assert [columns.names[i] for i in columns.name_id[named]] == [
        expected_columns.names[i] for i in expected_columns.name_id[named]
    ]
    assert summarize(columns).values == pytest.approx(summarize(expected_columns).values, nan_ok=True)
    empty = window_events_from_kineto(type("Results", (), {"events": lambda self: []})())
    assert len(empty) == 0 and not summarize(empty).device_assessed
