"""Shared test setup: real MLflow stores in temp folders, the recorded fixtures (tests/fixtures), no telemetry."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    previous = Path.cwd()
    os.chdir(path.parent)  # MLflow 2.x makes ./mlruns where a store is opened: beside the template, not in the repo
    try:
        MlflowClient(f"sqlite:///{path}").search_experiments()
    finally:
        os.chdir(previous)
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


@functools.cache
def _defines_a_module_fixture(module: Path) -> bool:
    return module.suffix == ".py" and '@pytest.fixture(scope="module"' in module.read_text()


@pytest.hookimpl(optionalhook=True)  # a hook of xdist, which the version matrix's environments may lack
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (make test) also sends all the tests of a module that defines a module-scoped fixture (a
    fit, the benchmark harness's run, that its tests only read) to one worker, so that the fixture is made once.

    xdist's own groups (`xdist_group` marks) suffix the test's node id, which pytest 9 no longer lets a plugin
    change; the scheduler, which sees only node ids, reads the module's source instead.
    """
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleFixtureScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if _defines_a_module_fixture(config.rootpath / module):
                return module
            return super()._split_scope(nodeid)

    return ModuleFixtureScheduling(config, log)
