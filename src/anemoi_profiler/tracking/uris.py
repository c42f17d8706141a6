"""Which MLflow a run goes to, and where a sqlite store keeps its artifacts."""

from __future__ import annotations

import os
from pathlib import Path

from anemoi_profiler.redaction import redact_uri
from anemoi_profiler.tracking.mlflow_versions import MODEL_TRAINING_VIEW


def default_tracking_uri(output_dir: str | Path) -> str:
    """The embedded default: a sqlite store beside the run folders (never the refused ./mlruns store)."""
    return f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}"


def artifact_location_for(tracking_uri: str) -> str | None:
    """Artifacts of a sqlite store go beside its database, not into ./mlruns of whatever the cwd is.

    Args:
        tracking_uri: The MLflow tracking URI the run will use.

    Returns:
        The URI of the `mlartifacts/` folder beside the sqlite file, for
        `MLFlowLogger(artifact_location=...)`; None for other stores, whose server decides.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()


def resolve_tracking_uri(configured: str | None, logger_uri: str | None, output_dir: str | Path) -> str:
    """Configured URI, else the MLFlowLogger's, else $MLFLOW_TRACKING_URI, else the embedded sqlite store."""
    return configured or logger_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(output_dir)


def run_url(server: str, experiment_id: str | None, run_id: str | None) -> str | None:
    """The run's page in the MLflow UI at `server` (http(s)://...), in the model-training view; credentials left out."""
    if not server.startswith(("http://", "https://")) or not experiment_id or not run_id:
        return None
    return f"{redact_uri(server).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING_VIEW}"
