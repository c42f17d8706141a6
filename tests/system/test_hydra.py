"""omegaconf 2.3 with hydra-core 1.3, beside the dev venv's omegaconf 2.4: the config-tree tests and the Hydra
example run against them in a subprocess, with the side install (`make .venv/omegaconf23/.installed`, a
prerequisite of `make test`) first on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from anemoi_profiler import names
from anemoi_profiler.run_files.layout import run_folders

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "hydra" / "train.py"


@pytest.fixture
def omegaconf23_env() -> dict[str, str]:
    """The environment of a process that imports omegaconf 2.3 and hydra-core 1.3."""
    folder = Path(os.environ.get("ANEMOI_PROFILER_OMEGACONF23", REPO / ".venv" / "omegaconf23"))
    if not (folder / ".installed").is_file():
        message = f"no omegaconf 2.3 + hydra-core 1.3 at {folder}: run `make .venv/omegaconf23/.installed`"
        if os.environ.get("CI"):
            pytest.fail(message)  # `make test` installs it: in CI its absence is a bug
        pytest.skip(message)
    return {**os.environ, "PYTHONPATH": str(folder), "MLFLOW_DISABLE_TELEMETRY": "true"}


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_config_tree_tests_pass_with_omegaconf_2_3_and_hydra_1_3(omegaconf23_env: dict[str, str]) -> None:
    versions = run(["-c", "import omegaconf, hydra; print(omegaconf.__version__, hydra.__version__)"],
                   omegaconf23_env, REPO)  # fmt: skip
    omegaconf_version, hydra_version = versions.stdout.split()
    assert omegaconf_version.startswith("2.3.") and hydra_version.startswith("1.3."), versions.stdout

    config_trees = REPO / "tests" / "unit" / "test_config_trees.py"
    tests = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(config_trees)], omegaconf23_env, REPO)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "skipped" not in tests.stdout.splitlines()[-1], tests.stdout[-2000:]  # the Hydra tests ran too


@pytest.mark.slow
def test_hydra_example_takes_the_group_and_command_line_overrides(
    omegaconf23_env: dict[str, str], tmp_path: Path
) -> None:
    database = tmp_path / "mlflow.db"
    result = run(
        [str(EXAMPLE), "profiler=detailed", "diagnostics.profiler.log_every_n_steps=10",
         f"paths.output={tmp_path / 'out'}", f"diagnostics.profiler.tracking.uri=sqlite:///{database}",
         "diagnostics.profiler.report.console=false", "training.max_steps=40"],
        omegaconf23_env, tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    # The store this test chose, with its artifacts beside it, and paths.output: no outputs/, Hydra's record is in out/
    assert {path.name for path in tmp_path.iterdir()} <= {"mlflow.db", "mlartifacts", "out"}
    assert list((tmp_path / "out" / "hydra").glob("*/.hydra/config.yaml"))

    (folder,) = run_folders(tmp_path / "out" / "profiler")  # ${paths.output}/profiler, resolved
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["log_every_n_steps"] == 10  # the command line
    assert config["throughput"]["warmup_steps"] == 5  # the application's conf/config.yaml
    assert config["profiler"]["enabled"] and config["model_summary"]["enabled"]  # the detailed preset
    assert list((folder / "traces" / "train").glob("window_0/rank0.pt.trace.json.gz"))
    assert (folder / "model_summary.txt").is_file()

    client = MlflowClient(f"sqlite:///{database}")
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert {names.TRAIN_SAMPLES_PER_SEC, names.SUMMARY_TRAIN_SAMPLES_PER_SEC} <= set(mlflow_run.data.metrics)
    steps = [point.step for point in client.get_metric_history(mlflow_run.info.run_id, names.TRAIN_STEP_MS)]
    assert steps[:3] == [15, 25, 35]  # after 5 warmup batches, intervals of 10 from the command line


def test_hydra_example_refuses_a_misspelt_key_before_training(omegaconf23_env: dict[str, str], tmp_path: Path) -> None:
    result = run([str(EXAMPLE), "diagnostics.profiler.log_every_n_stepz=10", f"paths.output={tmp_path}"],
                 omegaconf23_env, tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert "Key 'log_every_n_stepz' not in 'ProfilerConfig'" in result.stderr
    assert not list(tmp_path.rglob("config.yaml"))  # nothing was started


def test_application_preset_builds_on_a_stored_one(omegaconf23_env: dict[str, str], tmp_path: Path) -> None:
    result = run([str(EXAMPLE), "profiler=windows", "--cfg", "job", "--package", "diagnostics.profiler"],
                 omegaconf23_env, tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    profiler = yaml.safe_load(result.stdout)
    assert profiler["profiler"]["enabled"] and profiler["profiler"]["train"]["repeat"] == 2  # conf/profiler/windows
    assert profiler["system"]["enabled"] and not profiler["hta"]["enabled"]  # from the stored simple preset
    assert profiler["log_every_n_steps"] == 20  # conf/config.yaml still has the last word
