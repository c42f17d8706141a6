"""The examples users copy from run as they are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names

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
