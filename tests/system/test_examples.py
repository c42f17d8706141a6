"""The examples users copy from run as they are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names
from tests.helpers.jobs import only_run, only_run_folder, run_ok, throughput_summary

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_plain_lightning_script_with_the_yaml_config(tmp_path: Path) -> None:
    """Everything it writes goes below the output_dir it is given: nothing into the working directory."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_with_profiler.py"), "--config", str(EXAMPLES / "simple.yaml"),
         "--max-steps", "30", f"output_dir={out}", "log_every_n_steps=10", "report.console=false"],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(cwd.iterdir()) == []
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("examples").experiment_id])
    assert {"train/loss", names.TRAIN_SAMPLES_PER_SEC, names.SUMMARY_TRAIN_STEP_MS} <= set(run.data.metrics)


@pytest.mark.slow
def test_ddp_example_two_ranks_share_one_run(tmp_path: Path) -> None:
    """The DDP example as documented (Lightning's launcher, 2 CPU ranks on gloo), a few steps: one run folder
    whose report counts both ranks' batches, and one MLflow run holding the logger's loss and the profiler's
    throughput, in the sqlite store below the output folder."""
    out = tmp_path / "out"
    steps, warmup = 8, 2
    command = [sys.executable, str(EXAMPLES / "ddp_train.py"), f"--max-steps={steps}", f"--output-dir={out}",
               "log_every_n_steps=4", f"throughput.warmup_steps={warmup}", "report.console=false"]  # fmt: skip
    run_ok(command, tmp_path)
    summary = throughput_summary(only_run_folder(out))
    assert summary["train/measured_batches"] == 2 * (steps - warmup)
    assert summary["train/samples_per_sec"] > 0
    run = only_run(f"sqlite:///{out / 'mlflow.db'}")
    assert {"train/loss", names.TRAIN_SAMPLES_PER_SEC} <= set(run.data.metrics)
