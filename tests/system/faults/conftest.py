"""Fixtures of the fault-injection suite: ready MLflow stores and a real tracking server.

Creating a sqlite MLflow store runs MLflow's migrations, which takes seconds; each test gets a copy of one
store migrated once per session instead.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.mlflow_server import MlflowServer


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sqlite MLflow store with MLflow's tables created; copy it, never write to it."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def new_store(migrated_store: Path) -> Callable[[Path], str]:
    """`new_store(path)` puts a fresh, migrated store at `path` and returns its tracking URI."""

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_store, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, migrated_store: Path) -> Iterator[MlflowServer]:
    """A real `mlflow server` on 127.0.0.1, shared by the tests that need HTTP."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    shutil.copyfile(migrated_store, server.folder / "server.db")
    server.start()
    yield server
    server.stop()
