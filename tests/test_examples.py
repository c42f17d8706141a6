"""The examples users copy from run as they are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_plain_lightning_script_with_the_yaml_config(tmp_path: Path) -> None:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_with_profiler.py"), "--config", str(EXAMPLES / "simple.yaml"),
         "--max-steps", "30", f"output_dir={tmp_path}", "log_every_n_steps=10", "report.console=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("examples").experiment_id])
    assert {"train/loss", "throughput/train/samples_per_sec", "summary/train/step_ms"} <= set(run.data.metrics)
