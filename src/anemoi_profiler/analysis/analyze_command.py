"""`anemoi-profiler analyze <trace folder | run folder | MLflow run id>`: analyse, print, exit code.

Input problems (a missing folder, no traces, a corrupt file, HTA not installed, a run that cannot be
downloaded) end with one line naming the cause and exit code 1, never a traceback.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from anemoi_profiler.analysis.hta_runner import (
    HtaNotInstalledError,
    analyze,
    format_summary,
    require_hta,
    write_summary,
)
from anemoi_profiler.analysis.preflight import OUTPUT_FOLDER_NAME, NoTracesError, TraceError

RUN_TRACES_ARTIFACT = "profiler/traces"


class RunDownloadError(Exception):
    """The traces of an MLflow run could not be downloaded."""


def run_analyze_cli(target: str, output: str | None, time_limit_s: float, tracking_uri: str | None = None) -> int:
    """Analyse `target` and print the summary; return 0, or 1 after a one-line message on stderr.

    `target` is a trace folder, a run folder, or (when it is no folder and a tracking URI is given, or
    set in MLFLOW_TRACKING_URI) an MLflow run id whose `profiler/traces` artifacts are analysed.
    Results go to `output`, by default `<target>/hta` for a folder and `./hta_<run id>` for a run.
    """
    try:
        summary = _analyze_target(target, output, time_limit_s, tracking_uri)
    except (TraceError, NoTracesError, HtaNotInstalledError, RunDownloadError, OSError) as error:
        message = " ".join(str(error).split())
        print(f"anemoi-profiler analyze: {message}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0


def download_run_traces(run_id: str, tracking_uri: str, dst: Path) -> Path:
    """Download the run's `profiler/traces` folder (one sub-folder per stage and window) into `dst`."""
    import mlflow

    try:
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=RUN_TRACES_ARTIFACT, tracking_uri=tracking_uri, dst_path=str(dst)
        )
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunDownloadError(
            f"could not download {RUN_TRACES_ARTIFACT} of MLflow run {run_id!r} from {tracking_uri}: {reason}"
        ) from error
    return Path(local)


def _analyze_target(target: str, output: str | None, time_limit_s: float, tracking_uri: str | None) -> dict[str, Any]:
    folder = Path(target)
    if folder.exists():
        return analyze(folder, Path(output) if output else folder / OUTPUT_FOLDER_NAME, time_limit_s)
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not tracking_uri:
        raise NoTracesError(f"no such folder: {target} (for an MLflow run, give its id and --tracking-uri)")
    require_hta()  # before a download that may take minutes
    out_dir = Path(output) if output else Path.cwd() / f"hta_{target}"
    with tempfile.TemporaryDirectory(prefix="anemoi-profiler-traces-") as download_dir:
        traces = download_run_traces(target, tracking_uri, Path(download_dir))
        summary = analyze(traces, out_dir, time_limit_s)
    summary["target"] = f"MLflow run {target} ({RUN_TRACES_ARTIFACT} from {tracking_uri})"
    write_summary(out_dir, summary)
    return summary
