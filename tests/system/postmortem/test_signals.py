"""Stopped from outside: SIGTERM (Lightning's handler stops the fit) and SIGUSR1 with no handler (the process
ends): the stacks and the step are recorded, the MLflow run is KILLED and tagged, and the signal does what it
did without the profiler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anemoi_profiler import names
from anemoi_profiler.reports.run_data import read_history
from tests.system.faults.fault_helpers import only_run, only_run_folder

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)

REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "tests" / "system" / "faults" / "train_until_signalled.py"


def signalled_job(tmp_path: Path, signum: signal.Signals) -> tuple[int, str]:
    """The job trains until 5 batches are done, gets `signum`, and is waited for."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    ready, log = tmp_path / "job.ready", (tmp_path / "job.log").open("w")
    command = [sys.executable, str(JOB), str(tmp_path / "runs"), str(ready), "--profiled"]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signum)
    code = process.wait(120)
    log.close()
    return code, (tmp_path / "job.log").read_text()


@pytest.mark.slow
def test_sigterm_records_the_step_and_marks_the_run_killed(tmp_path: Path, new_store: Callable[[Path], str]) -> None:
    store = new_store(tmp_path / "runs" / "mlflow.db")
    code, output = signalled_job(tmp_path, signal.SIGTERM)
    assert code == 0, output[-3000:]  # Lightning's handler stopped the fit: its SIGTERMException exits with 0

    folder = only_run_folder(tmp_path / "runs")
    record = json.loads((folder / "postmortem" / "signal_rank0.json").read_text())
    assert record["signal"] == "SIGTERM" and record["step"] >= 5 and not record["process_ends"]
    assert any(thread["name"] == "MainThread" for thread in record["threads"])
    report = json.loads((folder / "report.json").read_text())
    assert report["header"]["status"] == "KILLED"
    assert report["header"]["postmortem"] == f"stopped by signal at step {record['step']} (SIGTERM)"
    assert report["sections"]["Diagnosis"]["data"]["verdicts"][0]["id"] == "stopped-by-signal"

    run = only_run(store)
    assert run.info.status == "KILLED"
    assert run.data.tags["profiler.postmortem"] == "signal"
    assert f"stopped by signal at step {record['step']} (SIGTERM)" in run.data.tags["mlflow.note.content"]


@pytest.mark.slow
def test_a_signal_with_no_handler_ends_the_process_after_sending_what_was_measured(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """Lightning sets no SIGUSR1 handler outside SLURM: its default action ends the process, as without us."""
    store = new_store(tmp_path / "runs" / "mlflow.db")
    code, output = signalled_job(tmp_path, signal.SIGUSR1)
    assert code == -signal.SIGUSR1, output[-3000:]

    folder = only_run_folder(tmp_path / "runs")
    record = json.loads((folder / "postmortem" / "signal_rank0.json").read_text())
    assert record["signal"] == "SIGUSR1" and record["process_ends"]
    assert read_history(folder)[names.TRAIN_STEP_MS]["step"][:2] == [2, 4]  # metrics.json, written first
    run = only_run(store)
    assert run.info.status == "KILLED"
    assert run.data.tags["profiler.postmortem"] == "signal"
    assert f"stopped by signal at step {record['step']} (SIGUSR1)" in run.data.tags["mlflow.note.content"]
