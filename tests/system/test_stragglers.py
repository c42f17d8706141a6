"""Who everyone waits for, in real 2-rank DDP jobs on CPU (gloo): a rank that sleeps in its step, a rank with a
slow dataloader, gradient accumulation, balanced ranks, and the same weights with and without the timing hook.
Samples fed twice to two ranks are counted once when declared."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from statistics import median

import pytest
import torch

from anemoi_profiler import names
from anemoi_profiler.reports.diagnosis import diagnose
from anemoi_profiler.reports.run_data import load_run, read_history
from tests.helpers.jobs import FAST, job_command, only_run, only_run_folder, run_ok

SLEEP_MS = 60.0
pytestmark = pytest.mark.slow


def straggler_job(tmp_path: Path, *args: str) -> Path:
    output_dir = tmp_path / "runs"
    output_dir.mkdir(parents=True)
    run_ok(job_command("--devices=2", f"--output-dir={output_dir}", *FAST, *args), tmp_path)
    return only_run_folder(output_dir)


def values(run_dir: Path, key: str) -> list[float]:
    return read_history(run_dir)[key]["value"]


def verdicts(run_dir: Path) -> dict[str, str]:
    return {verdict.name: verdict.value for verdict in diagnose(load_run(run_dir))}


def test_a_rank_sleeping_in_its_step_is_named_and_the_others_wait_about_its_sleep(tmp_path: Path) -> None:
    run_dir = straggler_job(tmp_path, "--slow-rank=1", f"--slow-ms={SLEEP_MS:g}")

    slowest = values(run_dir, names.TRAIN_SLOWEST_RANK)
    assert sum(rank == 1.0 for rank in slowest) >= 0.8 * len(slowest), slowest
    assert median(values(run_dir, names.TRAIN_STRAGGLER_MS)) == pytest.approx(SLEEP_MS, rel=0.3)
    assert only_run(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}").data.metrics[names.SUMMARY_TRAIN_SLOWEST_RANK] == 1
    verdict = verdicts(run_dir)["slow rank"]
    assert f"for rank 1 on {socket.gethostname()}" in verdict
    assert "its data loading does not explain it" in verdict
    ranks = json.loads((run_dir / "report.json").read_text())["sections"]["Ranks"]["data"]
    assert ranks["the rank the others wait for"] == f"rank 1 ({socket.gethostname()})"


def test_a_rank_with_a_slow_dataloader_is_named_with_data_loading_as_the_cause(tmp_path: Path) -> None:
    run_dir = straggler_job(tmp_path, "--slow-data-rank=1", f"--slow-data-ms={SLEEP_MS:g}")

    for key in (names.TRAIN_SLOWEST_RANK, names.TRAIN_DATALOADER_SLOWEST_RANK):
        slowest = values(run_dir, key)
        assert sum(rank == 1.0 for rank in slowest) >= 0.8 * len(slowest), (key, slowest)
    assert median(values(run_dir, names.TRAIN_DATALOADER_WAIT_MS_MAX)) == pytest.approx(SLEEP_MS, rel=0.3)
    assert "its own data wait explains it" in verdicts(run_dir)["slow rank"]


def test_with_gradient_accumulation_the_wait_is_per_optimizer_step(tmp_path: Path) -> None:
    """Lightning broadcasts a stop signal before every batch: under accumulation half the straggler's lead is
    waited out there, not in the gradient all-reduce, and must still count."""
    run_dir = straggler_job(tmp_path, "--accumulate=2", "--slow-rank=1", f"--slow-ms={SLEEP_MS / 2:g}")

    slowest = values(run_dir, names.TRAIN_SLOWEST_RANK)  # a busy machine once made rank 0 the slower in one interval
    assert sum(rank == 1.0 for rank in slowest) >= 0.8 * len(slowest), slowest
    assert median(values(run_dir, names.TRAIN_STRAGGLER_MS)) == pytest.approx(SLEEP_MS, rel=0.3)
    assert "per optimizer step" in verdicts(run_dir)["slow rank"]


def test_balanced_ranks_give_no_verdict_and_the_timing_hook_changes_no_weight(tmp_path: Path) -> None:
    # Without MLflow: the steps would run beside rank 0's MLflow sender importing MLflow, on the two cores the ranks
    # keep busy. Every step waits 30 ms off the CPU on both ranks, as a GPU step does: a busy machine's scheduling
    # noise (about 1 ms a step with two CPU-bound processes beside the ranks, 12 % of a 7 ms CPU step) is then a
    # small share of it. 60 steps: 15 log intervals, whose median holds when one rank is slowed for a few of them.
    quiet = ["tracking.enabled=false", "--max-steps=60", "--step-ms=30"]
    timed = straggler_job(tmp_path / "timed", f"--save-weights={tmp_path / 'timed.pt'}", *quiet)
    untimed = straggler_job(
        tmp_path / "untimed", f"--save-weights={tmp_path / 'untimed.pt'}", "distributed.straggler=false", *quiet
    )

    assert "slow rank" not in verdicts(timed)
    assert median(values(timed, names.TRAIN_STRAGGLER_MS)) < 0.1 * median(values(timed, names.TRAIN_STEP_MS))
    assert names.TRAIN_STRAGGLER_MS not in read_history(untimed)
    weights, reference = torch.load(tmp_path / "timed.pt"), torch.load(tmp_path / "untimed.pt")
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[name], reference[name]) for name in weights)


def test_two_ranks_fed_the_same_samples_count_them_once_when_declared(tmp_path: Path) -> None:
    run_dir = straggler_job(tmp_path, "--same-samples", "distributed.data_parallel_size=1")

    throughput = json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["data"]
    assert throughput["train/samples_per_sec"] == pytest.approx(throughput["train/device/samples_per_sec"], rel=0.25)
    assert (
        "(distributed.data_parallel_size)"
        in json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["note"]
    )
