"""The window summaries' exchange: its size at scale, and a real 2-rank gloo fit that writes the table and metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from anemoi_profiler import names
from anemoi_profiler.cli.summarize_command import summarize_folder
from anemoi_profiler.cluster.window_exchange import exchange_bytes, exchange_summaries, spread_metrics
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.profiling.window_events import DEVICE, LAUNCH, STEP, WindowEventsBuilder
from anemoi_profiler.profiling.window_summarizer import write_kernel_names
from anemoi_profiler.profiling.window_summary import VECTOR_LENGTH, summarize
from anemoi_profiler.run_files.layout import METRICS_FILE, kernel_names_path, window_dir, window_summary_path
from tests.helpers.jobs import FAST, SMALL_WINDOWS, job_command, only_run, only_run_folder, run_ok


@pytest.mark.parametrize(("world_size", "table_kb"), [(8, 5.82), (64, 46.6), (1000, 728.0)])
def test_the_exchange_stays_under_a_kilobyte_per_rank_and_window(world_size: int, table_kb: float) -> None:
    per_rank, table = exchange_bytes(world_size)
    assert per_rank == (3 + VECTOR_LENGTH) * 8 == 728  # the window's stage, index and step, then its summary
    assert table / 1000 == pytest.approx(table_kb, rel=0.01)


def test_a_single_process_exchange_reads_the_names_and_gives_every_window(tmp_path: Path) -> None:
    events = WindowEventsBuilder()
    events.add("ProfilerStep#1", STEP, 0.0, 50.0)
    events.add("cudaLaunchKernel", LAUNCH, 1.0, 2.0, correlation=7)
    events.add("gemm", DEVICE, 5.0, 20.0, stream=7, correlation=7)
    summary = summarize(events.build())
    for stage in ("train", "val"):  # as the summary thread writes them
        write_kernel_names(kernel_names_path(tmp_path, stage, 0, 0), summary)
    tables = exchange_summaries(RankExchange(), tmp_path, {("train", 0): summary, ("val", 0): summary}, slots=3)
    assert sorted(tables) == [("train", 0), ("val", 0)]
    assert tables[("train", 0)].top_kernels(0)[0]["name"] == "gemm"
    assert json.loads(kernel_names_path(tmp_path, "val", 0, 0).read_text()) == summary.name_table()
    metrics = spread_metrics("train", tables[("train", 0)])
    assert metrics[names.window_spread("train", "device_span_ms", "max")] == pytest.approx(0.02)
    assert metrics[names.window_spread("train", "device_span_ms", "argmax_rank")] == 0


@pytest.mark.slow
def test_two_gloo_ranks_write_one_table_and_the_spread_metrics(tmp_path: Path) -> None:
    output_dir = tmp_path / "runs"
    # 150 ms of waiting in each step (as on a GPU) gives window 0's summary, made in the helper process from its
    # trace, the 14 steps after it to reach an exchange during the run, however busy the machine
    command = job_command("--devices=2", f"--output-dir={output_dir}", "--step-ms=150", *FAST, *SMALL_WINDOWS)
    run_ok(command, tmp_path)
    run_dir = only_run_folder(output_dir)
    metrics = only_run(f"sqlite:///{output_dir / 'mlflow.db'}").data.metrics
    for window in (0, 1):
        with window_summary_path(run_dir, "train", window, ".csv").open() as file:
            rows = list(csv.DictReader(file))
        assert [row["rank"] for row in rows] == ["0", "1"]
        assert all(row["idle_pct"] == "" for row in rows)  # CPU-only: device figures not assessed
        assert all(float(row["steps"]) == 2 and float(row["host_busy_pct"]) > 0 for row in rows)
        table = json.loads(window_summary_path(run_dir, "train", window, ".json").read_text())
        assert [rank["rank"] for rank in table["ranks"]] == [0, 1]
        assert kernel_names_path(run_dir, "train", window, 1).is_file()
    # the same figures as `summarize` reads from the traces of the same window
    from_traces = summarize_folder(window_dir(run_dir, "train", 0))
    in_process = json.loads(window_summary_path(run_dir, "train", 0, ".json").read_text())["ranks"]
    for rank in (0, 1):
        assert from_traces.column("window_ms")[rank] == pytest.approx(in_process[rank]["window_ms"], rel=1e-3)
        assert from_traces.column("host_collective_ms")[rank] == pytest.approx(
            in_process[rank]["host_collective_ms"], rel=1e-2, abs=1e-3
        )
    low, mid, high = (metrics[names.window_spread("train", "window_ms", s)] for s in ("min", "median", "max"))
    assert 0 < low <= mid <= high
    assert metrics[names.window_spread("train", "window_ms", "argmax_rank")] in (0.0, 1.0)
    assert metrics[names.window_spread("train", "host_collective_ms", "max")] > 0  # DDP's gradient all-reduce, on gloo
    assert names.window_spread("train", "idle_pct", "max") not in metrics  # never a figure nobody assessed
    # exchanged during the run: window 0 (batches 4-5) at a training interval before the last one (step 20)
    history = json.loads((run_dir / METRICS_FILE).read_text())
    window_0_logged = history[names.window_spread("train", "window_ms", "max")]["time"][0]
    assert window_0_logged < history[names.TRAIN_STEP_MS]["time"][-1]
    # at each window's own step, the global step after its last batch (batches 4-5: 6, 8-9: 10), not its index
    assert history[names.window_spread("train", "window_ms", "max")]["step"] == [6, 10]
    report = json.loads((run_dir / "report.json").read_text())["sections"]["Window summary"]
    assert [row[:2] for row in report["rows"]] == [["train/window_0", 2], ["train/window_1", 2], ["val/window_0", 2]]
    assert report["rows"][0][3] == "not assessed"  # CPU-only: no device idle
