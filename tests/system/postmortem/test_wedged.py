"""A training step wedged in C code that keeps the interpreter lock: the stall watchdog (a Python thread) cannot
run, faulthandler's C timer writes the stacks and the MLflow sender (another process) records the stall and tags
the run while the job is still wedged; once the call returns, the report lists that stall once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.jobs import JOB_TIMEOUT_S, finish_job, only_run, only_run_folder, start_job

HERE = Path(__file__).resolve().parent
JOB = HERE / "wedged_job.py"
REPO = HERE.parents[2]
WEDGED_AT_STEP = 6
WEDGED_S = 14


def stall_record(output_dir: Path) -> dict[str, Any] | None:
    for path in output_dir.glob("*/postmortem/stall_1.json"):
        return json.loads(path.read_text())
    return None


def stall_tagged(tracking_uri: str) -> Any:
    client = MlflowClient(tracking_uri)
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        if run.data.tags.get("profiler.postmortem") == "stall":
            return run
    return None


def poll(condition: Callable[[], Any], until: float) -> Any:
    while time.monotonic() < until:
        if found := condition():
            return found
        time.sleep(0.25)
    return None


@pytest.mark.slow  # 25 s on an idle machine, a minute on a loaded one: a fit, a 14 s wedge, the run's end
def test_a_step_wedged_with_the_gil_held_is_recorded_and_tagged_while_it_is_wedged(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    output_dir = tmp_path / "runs"
    store = new_store(output_dir / "mlflow.db")
    command = [sys.executable, str(JOB), str(output_dir), str(WEDGED_AT_STEP), str(WEDGED_S)]
    overrides = ["postmortem.stall_after_s=2", "tracking.flush_interval_s=0.5"]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    job = start_job([*command, *overrides], tmp_path, env)
    record = run = None
    try:
        assert job.stdout is not None
        for line in job.stdout:  # the job prints this line just before the wedge
            if line.startswith("wedged at step"):
                break
        wedged_at = time.monotonic()
        until = wedged_at + WEDGED_S - 1  # while it is still wedged
        record = poll(lambda: stall_record(output_dir), until)
        run = poll(lambda: stall_tagged(store), until)
        still_wedged = time.monotonic() < wedged_at + WEDGED_S
    finally:
        if job.poll() is None and (record is None or run is None):
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert record is not None, "no stall record while the step was wedged"
    assert run is not None, "no stall tag on the MLflow run while the step was wedged"
    assert still_wedged
    [rank] = record["ranks"]
    assert rank["phase"] == "forward (training_step)" and rank["last_step"] == WEDGED_AT_STEP
    assert rank["frame"].startswith("wedged_here (wedged_job.py:")
    assert run.info.status == "RUNNING"
    assert (
        f"stalled after step {WEDGED_AT_STEP}: rank 0 in forward (training\\_step)"
        in run.data.tags["mlflow.note.content"]
    )

    returncode, output = finish_job(job, time.monotonic() + JOB_TIMEOUT_S)
    assert returncode == 0, output[-6000:]
    assert f"fit returned after {WEDGED_AT_STEP + 4} steps" in output
    folder = only_run_folder(output_dir)
    assert sorted(path.name for path in (folder / "postmortem").glob("stall_*.json")) == ["stall_1.json"]
    stall = json.loads((folder / "postmortem" / "stall_1.json").read_text())
    assert stall["ranks"][0]["resumed_after_s"] is not None
    assert stall["ranks"][0]["frame"].startswith("wedged_here (wedged_job.py:")
    report = json.loads((folder / "report.json").read_text())
    stalls = [v for v in report["sections"]["Diagnosis"]["data"]["verdicts"] if v["id"] == "stall"]
    assert len(stalls) == 1 and "rank 0 in forward (training_step) at wedged_here" in stalls[0]["value"]
    assert stalls[0]["message"].startswith("Every stall ended")
    finished = only_run(store)
    assert finished.info.status == "FINISHED" and finished.data.tags["profiler.postmortem"] == "stall"
