"""Fixtures of the fault-injection suite: a real tracking server on a migrated store (tests/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.mlflow_server import MlflowServer


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, migrated_store: Path) -> Iterator[MlflowServer]:
    """A real `mlflow server` on 127.0.0.1, shared by the tests that need HTTP."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    shutil.copyfile(migrated_store, server.folder / "server.db")
    server.start()
    yield server
    server.stop()
