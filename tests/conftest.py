"""Shared test setup: real MLflow stores in temp folders, the recorded fixtures (tests/fixtures), no telemetry."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
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


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sqlite MLflow store with MLflow's tables created; copy it, never write to it.

    Creating a sqlite store runs MLflow's migrations, seconds on a busy machine for every new store; a copy of
    this one, made once per process (each xdist worker), opens at once.
    """
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def new_store(migrated_store: Path) -> Callable[[Path], str]:
    """`new_store(path)` puts a fresh, migrated store at `path` and returns its tracking URI.

    The Default experiment keeps its artifacts in ./mlruns of the folder a new store is opened from: the copy's
    points at the test's working directory, as the store made there would.
    """

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_store, path)
        with sqlite3.connect(path) as db:
            db.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                (str(Path.cwd() / "mlruns" / "0"),),
            )
        db.close()
        return f"sqlite:///{path}"

    return make


@pytest.fixture
def sqlite_uri(tmp_path: Path, new_store: Callable[[Path], str]) -> str:
    return new_store(tmp_path / "mlflow.db")


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With xdist's `--dist loadgroup` (make test), the tests that read one module-scoped fixture (a fit, a run of
    the benchmark harness) run on one worker, so that it is made once, not once on every worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        shared = (
            [name for name, defs in definitions.name2fixturedefs.items() if defs[-1].scope == "module"]
            if definitions
            else []
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}::{shared[0]}"))
