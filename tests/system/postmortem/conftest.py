"""Fixtures of the post-mortem tests: the fault suite's migrated MLflow stores."""

from tests.system.faults.conftest import migrated_store, new_store

__all__ = ["migrated_store", "new_store"]
