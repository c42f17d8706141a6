"""An MLflow run's `profiler/` artifacts fetched into a folder laid out as its run folder, so that `report`,
`compare` and `analyze` read a run that lives only in MLflow as they read a local one. MLflow is imported only
when a run is fetched: the commands start without it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from anemoi_profiler.run_files.layout import ARTIFACT_ROOT, HTA_DIR, REPORT_INPUTS, RUN_FILES, TRACES_DIR

MLFLOW_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,255}")
"""MLflow's rule for run ids: a target that is neither a folder nor this never becomes part of a path."""


class RunDownloadError(Exception):
    """The target is neither a folder nor an MLflow run whose files can be fetched; the message says which."""


def resolve_run(target: str, tracking_uri: str | None, download_to: Path, traces: bool = False) -> Path:
    """The folder `target`; else the MLflow run with that id, downloaded below `download_to` (see `download_run`).

    The tracking URI is `tracking_uri`, else $MLFLOW_TRACKING_URI; without either a missing folder is an error.
    A target that is neither a folder nor a well-formed run id is refused before MLflow is asked anything.
    """
    if Path(target).exists():
        return Path(target)
    if not MLFLOW_RUN_ID.fullmatch(target):
        raise RunDownloadError(f"no such folder: {target} (nor an MLflow run id: letters, digits, '-' and '_')")
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not tracking_uri:
        raise RunDownloadError(f"no such folder: {target} (for an MLflow run, give its id and --tracking-uri)")
    return download_run(target, tracking_uri, download_to, traces)


def download_run(run_id: str, tracking_uri: str, dst: Path, traces: bool = False) -> Path:
    """Download an MLflow run's `profiler/` artifacts into `dst`, laid out as in the run folder: the report
    inputs (`REPORT_INPUTS` that the run has), or with `traces` its `traces/` folder alone."""
    if traces:
        _download(run_id, tracking_uri, TRACES_DIR, dst)
        return dst
    try:
        available = _artifact_paths(run_id, tracking_uri)
    except Exception as error:
        raise RunDownloadError(f"cannot read MLflow run {run_id!r} at {tracking_uri}: {_first_line(error)}") from None
    wanted = [name for name in REPORT_INPUTS if f"{ARTIFACT_ROOT}/{name}" in available]
    if not any(name in RUN_FILES for name in wanted):
        raise RunDownloadError(f"MLflow run {run_id!r} has no {ARTIFACT_ROOT}/ run files ({', '.join(RUN_FILES)})")
    for name in wanted:
        _download(run_id, tracking_uri, name, dst)
    return dst


def _download(run_id: str, tracking_uri: str, name: str, dst: Path) -> None:
    """Download `profiler/<name>` to `dst/<name>`. MLflow 2.x lays a download out under the artifact's whole path,
    3.x under its last part: the path MLflow returns says where, on either, and the file or folder moves from there."""
    import mlflow

    artifact, target = f"{ARTIFACT_ROOT}/{name}", dst / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _without_progress_bars(), tempfile.TemporaryDirectory(dir=target.parent) as folder:
            downloaded = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=artifact, tracking_uri=tracking_uri, dst_path=folder
            )
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(downloaded, target)
    except Exception as error:
        message = f"could not download {artifact} of MLflow run {run_id!r} from {tracking_uri}: {_first_line(error)}"
        raise RunDownloadError(message) from None


@contextlib.contextmanager
def _without_progress_bars() -> Iterator[None]:
    """MLflow draws one progress bar per file downloaded; a handful of small files do not need them."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _artifact_paths(run_id: str, tracking_uri: str) -> set[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found: set[str] = set()
    for folder in (ARTIFACT_ROOT, f"{ARTIFACT_ROOT}/{HTA_DIR}"):
        found.update(info.path for info in client.list_artifacts(run_id, folder) if not info.is_dir)
    return found


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
