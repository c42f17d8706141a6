"""Which MLflow a run goes to, and where a sqlite store keeps its artifacts."""

from __future__ import annotations

import os
from pathlib import Path


def default_tracking_uri(output_dir: str | Path) -> str:
    """The embedded default: a sqlite store beside the run folders (never the refused ./mlruns store)."""
    return f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}"


def artifact_location_for(tracking_uri: str) -> str | None:
    """Artifacts of a sqlite store go beside its database, not into ./mlruns of whatever the cwd is."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()


def resolve_tracking_uri(configured: str | None, logger_uri: str | None, output_dir: str | Path) -> str:
    """Configured URI, else the MLFlowLogger's, else $MLFLOW_TRACKING_URI, else the embedded sqlite store."""
    return configured or logger_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(output_dir)
