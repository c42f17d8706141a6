"""Stalls: a rank held in its training step while the other waits for it in the gradient all-reduce, in a real
2-rank gloo DDP fit; the stall record names the held rank, its frame and the waiting one, and the fit finishes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers.jobs import only_run, only_run_folder, run_jobs

HERE = Path(__file__).resolve().parent
JOB = HERE / "stalling_job.py"
REPO = HERE.parents[1]
HELD_AT_STEP = 6


@pytest.mark.slow
def test_a_rank_held_in_its_step_is_named_and_the_other_waits_in_the_all_reduce(tmp_path: Path) -> None:
    output_dir = tmp_path / "runs"
    command = [sys.executable, str(JOB), str(output_dir), "1", str(HELD_AT_STEP), "10", "postmortem.stall_after_s=3"]
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    [(returncode, output)] = run_jobs([command], tmp_path, {"PYTHONPATH": pythonpath})
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
    for rank in (0, 1):  # every thread's stack, the training thread's with the held frame on rank 1
        part = json.loads((folder / "postmortem" / "stall_1" / f"rank{rank}.json").read_text())
        main = next(thread for thread in part["threads"] if thread["name"] == "MainThread")
        functions = [frame["function"] for frame in main["stack"]]
        assert ("held_here" in functions) == (rank == 1)
        assert "anemoi-profiler-watchdog" in [thread["name"] for thread in part["threads"]]

    report = json.loads((folder / "report.json").read_text())
    first = report["sections"]["Diagnosis"]["data"]["verdicts"][0]
    assert first["id"] == "stall" and first["severity"] == "medium"
    assert "rank 1 in forward (training_step) at held_here" in first["value"]
    run = only_run(f"sqlite:///{output_dir / 'mlflow.db'}")
    assert run.info.status == "FINISHED"
    assert run.data.tags["profiler.postmortem"] == "stall"
    assert "stall" in run.data.tags["profiler.verdict"].split(",")
