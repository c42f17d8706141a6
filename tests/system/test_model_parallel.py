"""Lightning's ModelParallelStrategy on 2 CPU ranks (gloo): FSDP2 (`fully_shard`) with the detailed preset, and
tensor parallelism, whose two ranks see the same samples and must be counted once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning.pytorch import strategies

from tests.helpers.jobs import (
    EXAMPLES,
    assert_each_interval_sums_the_two_ranks,
    job_command,
    only_run,
    only_run_folder,
    run_ok,
    trace_ranks,
)

EXAMPLE = EXAMPLES / "model_parallel_train.py"
FAST = ["--max-steps=16", "log_every_n_steps=4", "throughput.warmup_steps=2", "report.console=false"]
PEAK = "throughput.device_peak_flops=1e12"  # CPU has no known peak: MFU only with one given
pytestmark = [
    pytest.mark.slow,
    pytest.mark.stack,
    pytest.mark.skipif(
        not hasattr(strategies, "ModelParallelStrategy"),
        reason="ModelParallelStrategy (FSDP2, tensor parallelism) arrived in Lightning 2.4",
    ),
]


def job(tmp_path: Path, *args: str) -> Path:
    output_dir = tmp_path / "runs"
    output_dir.mkdir(parents=True)
    run_ok(job_command(f"--output-dir={output_dir}", *FAST, *args, script=EXAMPLE), tmp_path)
    return only_run_folder(output_dir)


def sections(run_dir: Path) -> dict[str, dict]:
    return json.loads((run_dir / "report.json").read_text())["sections"]


def test_fsdp2_with_the_detailed_preset_leaves_the_whole_run_folder(tmp_path: Path) -> None:
    windows = ["profiler.train.skip_first=2", "profiler.train.wait=1", "profiler.train.active=2"]
    run_dir = job(tmp_path, "--devices=2", "--data-parallel=2", "--tensor-parallel=1", "--preset=detailed", *windows)

    assert only_run(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}").info.status == "FINISHED"
    assert trace_ranks(run_dir) == {"train/window_0": [0, 1], "val/window_0": [0, 1]}
    hta = json.loads((run_dir / "hta" / "summary.json").read_text())
    assert [window["ranks"] for window in hta["windows"]] == [[0, 1], [0, 1]]
    for name in ("time_report.json", "memory_report.json", "report.html", "model_summary.txt"):
        assert (run_dir / name).is_file(), name
    assert "ModelParallelStrategy shards the model" in (run_dir / "model_summary.txt").read_text()
    throughput = sections(run_dir)["Throughput"]["data"]
    # Two replicas: the global rate adds rank 1's to rank 0's (it would equal rank 0's alone), interval by interval.
    assert throughput["train/samples_per_sec"] > throughput["train/device/samples_per_sec"]
    run = only_run(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert_each_interval_sums_the_two_ranks(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}", run.info.run_id)
    wait = sections(run_dir)["Ranks"]["data"]["collective wait"]
    assert wait.startswith("not assessed: ModelParallelStrategy reduces gradients with FSDP's reduce-scatter")


def test_tensor_parallel_ranks_on_the_same_samples_count_them_once_and_share_the_flops(tmp_path: Path) -> None:
    single = job(tmp_path / "one", "--devices=1", "--data-parallel=1", "--tensor-parallel=1", PEAK)
    parallel = job(tmp_path / "two", "--devices=2", "--data-parallel=1", "--tensor-parallel=2", PEAK)

    # One replica of two ranks on the same samples: each interval's global rate is the two ranks' mean, not sum.
    store = f"sqlite:///{tmp_path / 'two' / 'runs' / 'mlflow.db'}"
    assert_each_interval_sums_the_two_ranks(store, only_run(store).info.run_id, ranks_per_replica=2)
    assert "1 data-parallel replica(s) of 2 rank(s)" in sections(parallel)["Throughput"]["note"]
    # torch's FLOP counter sees DTensor shapes whole; each rank is credited its half of the replica's FLOPs.
    whole = sections(single)["Throughput"]["data"]["train/flops_per_sample"]
    assert sections(parallel)["Throughput"]["data"]["train/flops_per_sample"] == pytest.approx(whole / 2)
    ranks = sections(parallel)["Ranks"]["data"]
    assert ranks["data-parallel replicas"] == "1 (from the sampler replicas of ModelParallelStrategy)"
    assert "inside their forward and backward collectives" in ranks["collective wait"]
