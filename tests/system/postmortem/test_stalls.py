"""Stalls in real fits: a rank held in its training step while the other waits for it in the gradient all-reduce
(2-rank gloo DDP): the record names the held rank, its frame and the waiting one, MLflow says so while the job
hangs, and the folder says so after a kill or a rank's death; a DataLoader worker that stops answering."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.data import DataLoader, Dataset

from anemoi_profiler import build_callbacks
from anemoi_profiler.cli.main import main
from tests.helpers.jobs import JOB_TIMEOUT_S, finish_job, only_run, only_run_folder, run_jobs, start_job
from tests.helpers.lightning_models import TinyRegressor, trainer
from tests.system.faults.fault_helpers import quick_config

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)

HERE = Path(__file__).resolve().parent
JOB = HERE / "stalling_job.py"
REPO = HERE.parents[2]
HELD_AT_STEP = 6


@pytest.fixture
def held_job(tmp_path: Path, new_store: Callable[[Path], str]) -> Iterator[tuple[Any, str]]:
    """The job with rank 1 held for 10 minutes, and its MLflow store (migrated before the job and the test read it
    together); the job is killed with all its processes at the end of the test."""
    store = new_store(tmp_path / "runs" / "mlflow.db")
    command = [sys.executable, str(JOB), str(tmp_path / "runs"), "1", str(HELD_AT_STEP), "600"]
    overrides = ["postmortem.stall_after_s=3", "tracking.flush_interval_s=0.5"]
    job = start_job([*command, *overrides], tmp_path, {"PYTHONPATH": pythonpath()})
    yield job, store
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    if not job.stdout.closed:
        job.communicate()


def pythonpath() -> str:
    return os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])


def wait_for(condition: Callable[[], Any], job: Any, what: str) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline and job.poll() is None:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    os.killpg(job.pid, signal.SIGKILL)
    pytest.fail(f"never {what}; the job's output ends with:\n{job.communicate()[0][-6000:]}")


def merged_stall(output_dir: Path) -> dict[str, Any] | None:
    """`stall_1.json` once it has both ranks."""
    for path in output_dir.glob("*/postmortem/stall_1.json"):
        stall = json.loads(path.read_text())
        if len(stall["ranks"]) == 2:
            return stall
    return None


def stall_tag(tracking_uri: str) -> Any:
    """The job's MLflow run once it carries the stall's tag and a description naming the held rank."""
    client = MlflowClient(tracking_uri)
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        tags = run.data.tags
        if tags.get("profiler.postmortem") == "stall" and "rank 1 in forward" in tags.get("mlflow.note.content", ""):
            return run
    return None


@pytest.mark.slow
def test_a_hung_job_says_where_in_mlflow_while_it_hangs_and_its_folder_after_a_kill(
    tmp_path: Path, held_job: tuple[Any, str]
) -> None:
    job, store = held_job
    wait_for(lambda: merged_stall(tmp_path / "runs"), job, "a stall record of both ranks")
    run = wait_for(lambda: stall_tag(store), job, "the stall's tag on the MLflow run")
    description = run.data.tags["mlflow.note.content"]
    assert f"stalled after step {HELD_AT_STEP}: rank 1 in forward (training\\_step)" in description
    assert run.info.status == "RUNNING"
    os.killpg(job.pid, signal.SIGKILL)  # as a scheduler does at the time limit
    job.wait(60)

    folder = only_run_folder(tmp_path / "runs")
    assert not (folder / "report.json").exists()
    assert main(["report", str(folder)]) == 0
    report = json.loads((folder / "report.json").read_text())
    assert report["header"]["status"] == "ended before its report: its processes were killed"
    first = report["sections"]["Diagnosis"]["data"]["verdicts"][0]
    assert first["id"] == "stall" and first["message"].startswith("The run did not move on")
    assert "rank 1 in forward (training_step) at held_here" in first["value"]


@pytest.mark.slow
def test_a_rank_that_dies_during_a_stall_ends_the_job_with_the_stall_in_its_report(
    tmp_path: Path, held_job: tuple[Any, str]
) -> None:
    job, store = held_job
    stall = wait_for(lambda: merged_stall(tmp_path / "runs"), job, "a stall record of both ranks")
    wait_for(lambda: stall_tag(store), job, "the stall's tag on the MLflow run")
    held = next(part for part in stall["ranks"] if part["rank"] == 1)
    os.kill(held["pid"], signal.SIGKILL)  # the kernel's OOM killer, a node failure
    returncode, output = finish_job(job, time.monotonic() + JOB_TIMEOUT_S)
    assert returncode != 0, output[-6000:]

    # Rank 0's gloo all-reduce fails and its session ends FAILED with its report, unless Lightning's launcher
    # kills it first (SIGKILL, within 5 s of a child's death): then the user runs `report` on the folder.
    folder = only_run_folder(tmp_path / "runs")
    ended = (folder / "report.json").exists()
    assert main(["report", str(folder)]) == 0
    report = json.loads((folder / "report.json").read_text())
    assert report["header"]["status"] == ("FAILED" if ended else "ended before its report: its processes were killed")
    first = report["sections"]["Diagnosis"]["data"]["verdicts"][0]
    assert first["id"] == "stall" and first["message"].startswith("The run did not move on")
    assert "rank 1 in forward (training_step) at held_here" in first["value"]


@pytest.mark.slow
def test_a_rank_held_in_its_step_is_named_and_the_other_waits_in_the_all_reduce(tmp_path: Path) -> None:
    output_dir = tmp_path / "runs"
    command = [sys.executable, str(JOB), str(output_dir), "1", str(HELD_AT_STEP), "10", "postmortem.stall_after_s=3"]
    [(returncode, output)] = run_jobs([command], tmp_path, {"PYTHONPATH": pythonpath()})
    assert returncode == 0, output[-6000:]
    assert "rank 0: fit returned after 12 steps" in output  # the stall ended and the fit finished normally

    folder = only_run_folder(output_dir)
    stall = json.loads((folder / "postmortem" / "stall_1.json").read_text())
    assert stall["holding_ranks"] == [1] and stall["waiting_ranks"] == [0] and stall["missing_ranks"] == []
    assert stall["last_step"] == HELD_AT_STEP
    ranks = {part["rank"]: part for part in stall["ranks"]}
    assert ranks[1]["phase"] == "forward (training_step)"
    assert ranks[1]["frame"].startswith("held_here (stalling_job.py:")
    assert ranks[0]["phase"] == "backward: gradient all-reduce"
    assert all(part["resumed_after_s"] is not None for part in ranks.values())
    assert stall["summary"].startswith(f"stalled after step {HELD_AT_STEP}: rank 1 in forward (training_step)")
    if hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):  # torch >= 2.9 records gloo's collectives too
        assert stall["behind_in_collectives"] == {"default_pg": [1]}  # rank 0 started the all-reduce, rank 1 not
        assert ranks[0]["last_collectives"]["default_pg"]["collective"] == "gloo:all_reduce"
        recorder = folder / "postmortem" / "stall_1" / "flight_recorder"
        assert sorted(path.name for path in recorder.iterdir()) == ["rank_0", "rank_1"]
    for rank in (0, 1):  # every thread's stack, the training thread's with the held frame on rank 1
        part = json.loads((folder / "postmortem" / "stall_1" / f"rank{rank}.json").read_text())
        main = next(thread for thread in part["threads"] if thread["name"] == "MainThread")
        functions = [frame["function"] for frame in main["stack"]]
        assert ("held_here" in functions) == (rank == 1)
        assert "anemoi-profiler-watchdog" in [thread["name"] for thread in part["threads"]]

    report = json.loads((folder / "report.json").read_text())
    first = report["sections"]["Diagnosis"]["data"]["verdicts"][0]
    assert first["id"] == "stall" and first["message"].startswith("Every stall ended")
    assert "rank 1 in forward (training_step) at held_here" in first["value"]
    run = only_run(f"sqlite:///{output_dir / 'mlflow.db'}")
    assert run.info.status == "FINISHED"
    assert run.data.tags["profiler.postmortem"] == "stall"
    assert "stall" in run.data.tags["profiler.verdict"].split(",")


class SlowSample(Dataset):
    """Sample `slow_at` takes `slow_s` to read, as a file on a filesystem that stopped answering."""

    def __init__(self, size: int, slow_at: int, slow_s: float) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(0))
        self.slow_at, self.slow_s = slow_at, slow_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.slow_at:
            time.sleep(self.slow_s)
        return self.x[index], self.x[index].sum(dim=0, keepdim=True)


@pytest.mark.slow
def test_a_stall_in_a_dataloader_worker_reads_as_a_data_fetch(tmp_path: Path) -> None:
    data = DataLoader(SlowSample(16 * 12, slow_at=16 * 6, slow_s=6.0), batch_size=16, num_workers=1)
    config = quick_config(tmp_path / "runs", "postmortem.stall_after_s=2", "tracking.enabled=false")
    trainer(build_callbacks(config)).fit(TinyRegressor(), data)

    folder = only_run_folder(tmp_path / "runs")
    stall = json.loads((folder / "postmortem" / "stall_1.json").read_text())
    [rank] = stall["ranks"]
    assert rank["phase"] == "data fetch" and rank["last_step"] == 6
    assert rank["resumed_after_s"] is not None
    first = json.loads((folder / "report.json").read_text())["sections"]["Diagnosis"]["data"]["verdicts"][0]
    assert first["id"] == "stall" and "rank 0 in data fetch" in first["value"]
