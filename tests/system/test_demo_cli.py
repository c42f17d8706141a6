"""`anemoi-profiler demo` end to end, as a user runs it: a real process and the embedded sqlite store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names
from anemoi_profiler.tracking import mlflow_versions
from anemoi_profiler.tracking.mlflow_target import EXPERIMENT_TAGS

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


# The console script installed beside this interpreter: what a user of this environment runs.
CLI = str(Path(sys.executable).with_name("anemoi-profiler"))


@pytest.mark.slow
def test_demo_leaves_a_run_in_the_embedded_store_and_says_how_to_open_it(tmp_path: Path) -> None:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    result = subprocess.run(
        [CLI, "demo", "--max-steps", "40", "--output-dir", "out", "log_every_n_steps=10",
         "system.interval_s=1", "throughput.warmup_steps=3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    database = (tmp_path / "out" / "mlflow.db").resolve()
    assert f"mlflow ui --backend-store-uri sqlite:///{database}" in result.stdout
    # The printed command runs from a fresh shell, whose PATH does not have this environment's bin/.
    (printed,) = [line.split("open it with: ", 1)[1] for line in result.stdout.splitlines() if "open it with: " in line]
    bare = subprocess.run(
        ["bash", "-c", f"{printed} --help"], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bare.returncode == 0 and "--backend-store-uri" in bare.stdout, (printed, bare.stderr[-2000:])
    assert "anemoi-profiler report" in result.stdout and "Throughput" in result.stdout
    # Lightning's messages once each: a second handler on the root logger would print every one twice.
    output = result.stdout + result.stderr
    assert output.count("`Trainer.fit` stopped") == 1, output[-3000:]
    # Nothing in the refused file store, nothing in the cwd. MLflow 2.x's sqlite store makes its default artifact
    # root ./mlruns whenever a client opens it (the demo's MLFlowLogger too): empty, since artifacts go beside the db.
    mlruns = tmp_path / "mlruns"
    if mlflow_versions.mlflow_version() < mlflow_versions.SQLITE_STORE_MAKES_MLRUNS_BEFORE:
        assert not mlruns.exists() or not any(mlruns.iterdir())
    else:
        assert not mlruns.exists()

    client = MlflowClient(f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("anemoi-profiler")
    assert EXPERIMENT_TAGS.items() <= experiment.tags.items()  # made before the demo's logger, as the profiler does
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    for key in (
        names.TRAIN_SAMPLES_PER_SEC,
        names.TRAIN_ITEMS_PER_SEC,
        names.VAL_SAMPLES_PER_SEC,
        names.TRAIN_STEP_MS,
        names.TRAIN_DATALOADER_WAIT_MS,
        names.VAL_STEP_MS,
        names.CPU_RSS_MB,
        names.CPU_UTILIZATION,
        names.SUMMARY_TRAIN_SAMPLES_PER_SEC,
        names.SUMMARY_VAL_SAMPLES_PER_SEC,
        names.SUMMARY_TRAIN_STEP_MS,
        "train/loss",
    ):
        assert key in run.data.metrics, key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "profiler")}
    assert {
        "profiler/config.yaml",
        "profiler/environment.json",
        "profiler/report.txt",
        "profiler/report.json",
    } <= artifacts
    assert (tmp_path / "out" / "mlartifacts").is_dir()


def test_help_reads_well() -> None:
    result = subprocess.run([CLI, "--help"], capture_output=True, text=True, check=True)
    for command in ("demo", "component", "analyze", "report", "compare", "config", "sync"):
        assert command in result.stdout
    demo = subprocess.run([CLI, "demo", "--help"], capture_output=True, text=True, check=True)
    assert "--max-steps" in demo.stdout and "--preset" in demo.stdout and "key=value" in demo.stdout


def test_an_output_folder_that_cannot_be_made_is_a_clear_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    result = subprocess.run(
        [CLI, "demo", "--max-steps", "5", "--output-dir", str(blocked / "runs")], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert f"config error: output_dir {blocked / 'runs'} cannot be created" in result.stderr
    assert "Traceback" not in result.stderr
