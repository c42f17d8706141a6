"""Shared test setup: real MLflow stores in temp folders, the recorded fixtures (tests/fixtures), no telemetry."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from anemoi_profiler import wait_for_mlflow

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.pop("MLFLOW_TRACKING_URI", None)

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def sqlite_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(autouse=True)
def _isolated_mlflow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test in its own folder, with no tracking URI inherited.

    MLFlowLogger calls mlflow.set_tracking_uri, which also sets $MLFLOW_TRACKING_URI for the process, and
    experiments it creates on sqlite keep artifacts in ./mlruns of the working directory.
    """
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _deliveries_end_with_their_test() -> Iterator[None]:
    """A short fit's MLflow delivery, left to the background, ends with its test, not during the next one."""
    yield
    wait_for_mlflow()


def pytest_configure(config: pytest.Config) -> None:
    """pytorch_lightning, where installed, warns with its own copy of Lightning's advice category: allowed as
    lightning's is in pyproject.toml."""
    if importlib.util.find_spec("lightning_fabric") is not None:
        config.addinivalue_line("filterwarnings", "ignore::lightning_fabric.utilities.warnings.PossibleUserWarning")
