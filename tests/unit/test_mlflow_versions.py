"""The MLflow names that differ between versions (tracking/mlflow_versions.py) hold for the installed MLflow.

Run on every stack of the version matrix (ci/matrix): the floor's MLflow 2.16 and the newest 3.x. With MLflow 2.x,
ci/matrix/setup.sh also lays SQLAlchemy 2.1 in a folder of its own (`ANEMOI_PROFILER_SQLALCHEMY21`), put first on
the path of a demo in a subprocess: the combination pip picks for an MLflow 2.x client today.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from anemoi_profiler.tracking import mlflow_versions
from anemoi_profiler.tracking.mlflow_target import experiment_id
from tests.helpers.jobs import job_environment

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)

SQLALCHEMY21 = os.environ.get("ANEMOI_PROFILER_SQLALCHEMY21")


def test_the_installed_mlflow_is_the_one_the_metadata_names() -> None:
    major, minor, *_ = mlflow.__version__.split(".")
    assert mlflow_versions.mlflow_version() == (int(major), int(minor))


def test_a_description_of_the_longest_value_fits_this_mlflow_s_tags() -> None:
    assert mlflow_versions.MAX_TAG_VALUE_CHARS <= MAX_TAG_VAL_LENGTH


def test_the_longest_description_is_kept_whole_by_the_sqlite_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(experiment_id(client, uri, "e"))
    text = "x" * mlflow_versions.MAX_TAG_VALUE_CHARS
    client.set_tag(run.info.run_id, "mlflow.note.content", text)
    assert client.get_run(run.info.run_id).data.tags["mlflow.note.content"] == text


def test_the_file_store_is_refused_from_the_version_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    refused = mlflow_versions.mlflow_version() >= mlflow_versions.FILE_STORE_REFUSED_FROM
    try:
        MlflowClient(f"file:{tmp_path / 'mlruns'}").search_experiments()
        opened = True
    except Exception:
        opened = False
    assert opened != refused


def test_the_sqlite_store_opens_here_when_no_problem_is_named(tmp_path: Path) -> None:
    """The prediction matches this stack: no problem named, and the embedded default store works."""
    assert mlflow_versions.sqlite_store_problem() is None
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert experiment_id(MlflowClient(uri), uri, "e")


@pytest.mark.skipif(not SQLALCHEMY21, reason="needs ANEMOI_PROFILER_SQLALCHEMY21 (ci/matrix, MLflow 2.x only)")
def test_mlflow_2_with_sqlalchemy_2_1_is_a_clear_error_naming_the_fix(tmp_path: Path) -> None:
    """The demo on the embedded store with SQLAlchemy 2.1 beside MLflow 2.x: one clear line that names the fix, no
    traceback, and no "MLflow run None" or `mlflow ui` line for a run that was never made."""
    env = {**job_environment(), "PYTHONPATH": os.pathsep.join([str(SQLALCHEMY21), *sys.path])}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from anemoi_profiler.tracking.mlflow_versions import sqlite_store_problem as p; print(p())",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "pip install 'sqlalchemy<2.1'" in probe.stdout
    demo = subprocess.run(
        [sys.executable, "-m", "anemoi_profiler.cli", "demo", "--max-steps", "10", "--output-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = demo.stdout + demo.stderr
    assert demo.returncode == 2, output[-3000:]
    assert "pip install 'sqlalchemy<2.1'" in output
    assert "Traceback" not in output
    assert "MLflow run None" not in output and "mlflow ui" not in output


def test_the_sqlite_store_makes_mlruns_in_the_working_folder_where_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id(MlflowClient(uri), uri, "e")
    made = (tmp_path / "mlruns").exists()
    assert made == (mlflow_versions.mlflow_version() < mlflow_versions.SQLITE_STORE_MAKES_MLRUNS_BEFORE)
