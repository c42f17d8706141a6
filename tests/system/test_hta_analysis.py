"""HTA over the shared trace fixtures: the real HTA (traceinsight) in a real child process, no mocks."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anemoi_profiler import names
from anemoi_profiler.analysis import (
    NoTracesError,
    TraceError,
    analyze_window,
    check_window,
    find_window_dirs,
    format_summary,
)
from anemoi_profiler.analysis.hta_runner import HTA_INSTALL_HINT, NO_CUDA_SYNC, NO_GPU_KERNELS, NO_NCCL_KERNELS
from anemoi_profiler.analysis.hta_worker import (
    ANALYSIS_NAMES,
    LOAD_STEP,
    PROGRESS_FILE,
    misclassified_nccl_kernels,
    run_plan,
)
from anemoi_profiler.cli.analyze_command import run_analyze
from anemoi_profiler.cli.main import main

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


TIME_LIMIT_S = 240.0


@pytest.fixture
def traces(fixtures_dir: Path) -> Path:
    return fixtures_dir / "traces"


def copy_into(folder: Path, files: dict[str, Path]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        shutil.copyfile(source, folder / name)
    return folder


def read_summary(out_dir: Path) -> dict:
    return json.loads((out_dir / "summary.json").read_text())


def test_two_rank_nccl_sample_gives_both_ranks_and_overlap(traces: Path, tmp_path: Path) -> None:
    summary = analyze_window(traces / "hta_sampled_2rank", tmp_path, time_limit_s=TIME_LIMIT_S)

    assert summary["ranks"] == [0, 1]
    assert summary["failed"] == {}
    assert "comm_comp_overlap" in summary["ran"]
    for rank in (0, 1):
        assert 0 < summary["metrics"][names.hta_rank(rank, "comm_comp_overlap_pct")] <= 100
        assert 0 <= summary["metrics"][names.hta_rank(rank, "idle_pct")] <= 100
    assert summary["metrics"][names.hta_all_ranks("communication_kernel_time_pct")] > 0
    assert summary["top_kernels"][0]["name"].startswith("ncclKernel_SendRecv")
    assert (tmp_path / "comm_comp_overlap.csv").read_text().startswith("rank,")
    assert read_summary(tmp_path) == summary

    text = format_summary(summary)
    assert "ranks 0-1" in text
    assert "comm/comp overlap %" in text
    assert "ncclKernel_SendRecv" in text


def test_single_gpu_trace_gives_idle_and_temporal_metrics(traces: Path, tmp_path: Path) -> None:
    summary = analyze_window(traces / "h200_single_gpu", tmp_path, time_limit_s=TIME_LIMIT_S)

    metrics = summary["metrics"]
    assert summary["ranks"] == [0]
    assert summary["failed"] == {}
    assert {"temporal_breakdown", "idle_time_breakdown", "gpu_kernel_breakdown"} <= set(summary["ran"])
    parts = (
        metrics[names.hta_rank(0, "idle_pct")]
        + metrics[names.hta_rank(0, "compute_pct")]
        + metrics[names.hta_rank(0, "non_compute_pct")]
    )
    assert 0 < metrics[names.hta_rank(0, "idle_pct")] < 100
    assert parts == pytest.approx(100, abs=0.1)
    assert 0 <= metrics[names.hta_rank(0, "idle_host_wait_share_pct")] <= 100
    assert summary["skipped"] == {"comm_comp_overlap": NO_NCCL_KERNELS, "critical_path": NO_CUDA_SYNC}
    assert "enable_cuda_sync_events" in summary["skipped"]["critical_path"]
    assert summary["top_kernels"]
    for table in ("temporal_breakdown", "idle_time_breakdown", "gpu_kernel_breakdown", "kernel_type_breakdown"):
        assert (tmp_path / f"{table}.csv").exists()
        assert json.loads((tmp_path / f"{table}.json").read_text())
    assert summary["warnings"] == []  # one file without distributedInfo is rank 0, not a problem


def test_cpu_only_trace_skips_gpu_analyses_with_a_reason(traces: Path, tmp_path: Path) -> None:
    summary = analyze_window(traces / "cpu_only", tmp_path, time_limit_s=TIME_LIMIT_S)

    assert summary["ranks"] == [34]
    assert summary["ran"] == []
    assert summary["failed"] == {}
    assert summary["skipped"] == dict.fromkeys(ANALYSIS_NAMES, NO_GPU_KERNELS)
    assert summary["warnings"] == ["ranks missing from the folder: 0-33"]
    assert read_summary(tmp_path)["skipped"] == summary["skipped"]
    assert "skipped temporal_breakdown: no GPU kernels" in format_summary(summary)


def test_truncated_trace_is_named_in_the_error(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = copy_into(tmp_path / "window", {"rank1.json.gz": traces / "hta_sampled_2rank" / "sampled_rank-1.json.gz"})
    whole = (traces / "hta_sampled_2rank" / "sampled_rank-0.json.gz").read_bytes()
    truncated = folder / "rank0.json.gz"
    truncated.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(TraceError, match=r"rank0\.json\.gz: truncated or corrupt"):
        check_window(folder)
    with pytest.raises(TraceError, match=str(truncated)):
        analyze_window(folder, tmp_path / "out")

    assert run_analyze(str(folder), str(tmp_path / "out"), TIME_LIMIT_S) == 1
    message = capsys.readouterr().err
    assert str(truncated) in message
    assert len(message.strip().splitlines()) == 1


def test_plain_json_that_is_cut_short_or_no_trace_is_named(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text('{"traceEvents": [{"name": "ProfilerStep#1"')
    with pytest.raises(TraceError, match=r"rank0\.json: truncated or corrupt"):
        check_window(tmp_path)

    (tmp_path / "rank0.json").write_text('{"schemaVersion": 1}')
    with pytest.raises(TraceError, match=r"rank0\.json: not a PyTorch profiler trace"):
        check_window(tmp_path)


def test_duplicate_and_missing_ranks_are_reported(traces: Path, tmp_path: Path) -> None:
    rank1 = traces / "hta_sampled_2rank" / "sampled_rank-1.json.gz"
    both_rank1 = check_window(copy_into(tmp_path / "dup", {"a.json.gz": rank1, "b.json.gz": rank1}))
    (tmp_path / "unranked").mkdir()
    for name in ("x.json", "y.json"):
        (tmp_path / "unranked" / name).write_text('{"traceEvents": []}')
    unranked = check_window(tmp_path / "unranked")

    assert both_rank1.ranks == [1]
    assert both_rank1.duplicate_ranks == {1: [tmp_path / "dup" / "a.json.gz", tmp_path / "dup" / "b.json.gz"]}
    assert both_rank1.trace_files == {1: tmp_path / "dup" / "a.json.gz"}
    assert both_rank1.missing_ranks == [0]
    assert both_rank1.warnings == [
        "rank 1 appears in 2 files: a.json.gz, b.json.gz; analysed a.json.gz only",
        "ranks missing from the folder: 0",
    ]
    assert unranked.warnings == [
        "rank 0 appears in 2 files: x.json, y.json (x.json, y.json without distributedInfo.rank: read as rank 0); "
        "analysed x.json only"
    ]


def test_find_window_dirs_in_run_folder_plain_folder_and_traces_folder(traces: Path, tmp_path: Path) -> None:
    cpu_trace = traces / "cpu_only" / "rank-34.pt.trace.json.gz"
    run = tmp_path / "run"
    for window in ("train/window_0", "train/window_10", "train/window_2", "validation/window_0"):
        copy_into(run / "traces" / window, {"rank34.pt.trace.json.gz": cpu_trace})
    copy_into(run / "traces" / "hta" / "train", {"summary.json": cpu_trace})  # our own output: never a trace
    (run / "report.json").write_text("{}")

    expected = ["train/window_0", "train/window_2", "train/window_10", "validation/window_0"]
    assert [p.relative_to(run / "traces").as_posix() for p in find_window_dirs(run)] == expected
    assert find_window_dirs(run / "traces") == find_window_dirs(run)
    assert find_window_dirs(traces / "cpu_only") == [traces / "cpu_only"]
    (tmp_path / "empty").mkdir()
    assert find_window_dirs(tmp_path / "empty") == []
    with pytest.raises(NoTracesError):
        find_window_dirs(tmp_path / "absent")


def test_analyze_run_folder_prefixes_metrics_per_window(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sample = traces / "hta_sampled_2rank"
    run = tmp_path / "run"
    copy_into(
        run / "traces" / "train" / "window_0",
        {
            "rank0.pt.trace.json.gz": sample / "sampled_rank-0.json.gz",
            "rank1.pt.trace.json.gz": sample / "sampled_rank-1.json.gz",
        },
    )
    copy_into(
        run / "traces" / "validation" / "window_0",
        {"rank34.pt.trace.json.gz": traces / "cpu_only" / "rank-34.pt.trace.json.gz"},
    )

    assert run_analyze(str(run), None, TIME_LIMIT_S) == 0

    printed = capsys.readouterr().out
    assert "train/window_0: ranks 0-1" in printed
    assert "validation/window_0: rank 34" in printed
    summary = read_summary(run / "hta")
    assert [w["window"] for w in summary["windows"]] == ["train/window_0", "validation/window_0"]
    assert names.hta_window("train/window_0", names.hta_rank(1, "comm_comp_overlap_pct")) in summary["metrics"]
    assert read_summary(run / "hta" / "train" / "window_0")["metrics"][names.hta_rank(1, "comm_comp_overlap_pct")] > 0
    assert (run / "hta" / "train" / "window_0" / "temporal_breakdown.csv").exists()


def test_time_limit_stops_hta_and_says_so(traces: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    summary = analyze_window(traces / "hta_sampled_2rank", tmp_path, time_limit_s=0.5)
    elapsed = time.monotonic() - started

    assert summary["ran"] == []
    for planned in ("temporal_breakdown", "idle_time_breakdown", "comm_comp_overlap", "memory_bw_summary"):
        assert summary["skipped"][planned] == "time limit of 0.5 s reached"
    assert read_summary(tmp_path)["skipped"] == summary["skipped"]
    assert not (tmp_path / PROGRESS_FILE).exists()
    assert elapsed < 4, "the HTA process must be killed at the limit, not awaited"


def test_cli_exit_codes_for_missing_folder_and_folder_without_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert run_analyze(str(tmp_path / "absent"), None, TIME_LIMIT_S) == 1
    assert "no such folder" in capsys.readouterr().err

    (tmp_path / "empty").mkdir()
    assert run_analyze(str(tmp_path / "empty"), None, TIME_LIMIT_S) == 1
    err = capsys.readouterr().err
    assert "no trace files" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_without_hta_names_the_extra_and_package_imports_without_it(traces: Path, tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['hta'] = None\n"
        "from anemoi_profiler.cli.analyze_command import run_analyze\n"
        f"sys.exit(run_analyze({str(traces / 'hta_sampled_2rank')!r}, {str(tmp_path)!r}, 60))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)

    assert result.returncode == 1
    assert HTA_INSTALL_HINT in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_analyses_an_mlflow_run_by_id(
    traces: Path, tmp_path: Path, sqlite_uri: str, capsys: pytest.CaptureFixture
) -> None:
    mlflow = pytest.importorskip("mlflow")
    client = mlflow.MlflowClient(tracking_uri=sqlite_uri)
    experiment = client.create_experiment("hta", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_artifacts(run_id, str(traces / "cpu_only"), artifact_path="profiler/traces/train/window_0")

    assert run_analyze(run_id, str(tmp_path / "out"), TIME_LIMIT_S, tracking_uri=sqlite_uri) == 0
    assert f"MLflow run {run_id}" in capsys.readouterr().out
    assert read_summary(tmp_path / "out" / "train" / "window_0")["ranks"] == [34]

    assert run_analyze("0" * 32, str(tmp_path / "none"), TIME_LIMIT_S, tracking_uri=sqlite_uri) == 1
    err = capsys.readouterr().err
    assert "could not download profiler/traces of MLflow run" in err
    assert len(err.strip().splitlines()) == 1


def test_nccl_kernel_names_hta_would_not_count_as_communication() -> None:
    kernel_names = [
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "void ncclDevKernel_Generic()",
    ]
    assert misclassified_nccl_kernels(kernel_names) == ["void ncclDevKernel_Generic()"]


@pytest.mark.slow
def test_critical_path_runs_on_a_real_trace(traces: Path, tmp_path: Path) -> None:
    """The runner skips it without CUDA sync events (no fixture has them); HTA still computes a path."""
    folder = traces / "h200_single_gpu"
    plan = {
        "folder": str(folder),
        "out_dir": str(tmp_path),
        "trace_files": {"0": str(folder / "rank-0.pt.trace.json.gz")},
        "analyses": ["critical_path"],
        "critical_path_step": 1,
    }
    run_plan(plan)

    records = [json.loads(line) for line in (tmp_path / PROGRESS_FILE).read_text().splitlines()]
    assert [(r["analysis"], r["status"]) for r in records] == [(LOAD_STEP, "ran"), ("critical_path", "ran")]
    shares = records[1]["metrics"]
    assert sum(shares.values()) == pytest.approx(100, abs=0.1)
    assert names.hta_rank(0, "critical_path_cpu_bound_pct") in {names.HTA + key for key in shares}  # the runner's key
    assert (tmp_path / "critical_path_summary.csv").exists()


def test_truncated_gzip_detected_even_when_json_prefix_is_valid(tmp_path: Path) -> None:
    payload = json.dumps({"traceEvents": []}).encode()
    compressed = gzip.compress(payload)
    (tmp_path / "rank0.json.gz").write_bytes(compressed[:-4])  # CRC/length trailer cut off
    with pytest.raises(TraceError, match=r"rank0\.json\.gz: truncated or corrupt"):
        check_window(tmp_path)


def test_a_rank_subset_reads_and_analyses_only_those_ranks(traces: Path, tmp_path: Path) -> None:
    summary = analyze_window(traces / "hta_sampled_2rank", tmp_path, time_limit_s=TIME_LIMIT_S, ranks=[1])

    assert summary["ranks"] == [1]
    assert (
        names.hta_rank(1, "idle_pct") in summary["metrics"] and names.hta_rank(0, "idle_pct") not in summary["metrics"]
    )
    with pytest.raises(NoTracesError, match="no trace of ranks 5-6"):
        analyze_window(traces / "hta_sampled_2rank", tmp_path, time_limit_s=TIME_LIMIT_S, ranks=[5, 6])


def test_ranks_on_the_command_line(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = str(traces / "hta_sampled_2rank")
    assert main(["analyze", folder, "--output", str(tmp_path), "--ranks", "0"]) == 0
    assert [window["ranks"] for window in read_summary(tmp_path)["windows"]] == [[0]]
    assert main(["analyze", folder, "--ranks", "0-x"]) == 2
    assert "--ranks: '0-x' is no rank or range of ranks" in capsys.readouterr().err


def test_the_hta_process_is_stopped_past_its_memory_limit_and_says_so(traces: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    summary = analyze_window(traces / "hta_sampled_2rank", tmp_path, time_limit_s=TIME_LIMIT_S, memory_limit_mb=30)

    assert summary["ran"] == []
    for planned in ("temporal_breakdown", "idle_time_breakdown", "comm_comp_overlap", "memory_bw_summary"):
        assert summary["skipped"][planned] == "memory limit of 30 MB reached (hta.memory_limit_mb)"
    assert summary["peak_rss_mb"] > 30
    assert time.monotonic() - started < 30, "stopped at the limit, not after the analyses"
