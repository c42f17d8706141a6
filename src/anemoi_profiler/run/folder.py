"""The run folder's lifecycle, the same for a Trainer run and for component profiling.

Create it with the config and the environment, upload it to the MLflow run at the end, and say where to look.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.logs import PREFIX
from anemoi_profiler.redaction import redact, redact_uri
from anemoi_profiler.run_files.layout import (
    ARTIFACT_ROOT,
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    NOT_UPLOADED,
    create_run_folder,
)
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.tracking.uris import run_url

LOCAL_UI = "http://127.0.0.1:5000"
"""Where `mlflow ui` serves by default."""


def write_run_folder(config: ProfilerConfig, environment: Mapping[str, Any]) -> Path:
    """A new run folder below `config.output_dir` with `config.yaml` (secrets redacted) and `environment.json`."""
    run_dir = create_run_folder(Path(config.output_dir).resolve(), config.fingerprint())
    (run_dir / CONFIG_FILE).write_text(redacted_yaml(config))
    (run_dir / ENVIRONMENT_FILE).write_text(json.dumps(environment, indent=2, default=str))
    return run_dir


def redacted_yaml(config: ProfilerConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(redact(config.to_dict())))


def upload_folder(sink: TrackingSink, run_dir: Path, kept_local: Collection[Path] = ()) -> None:
    """Queue every file of the run folder for `ARTIFACT_ROOT/` of the MLflow run, except the spool and
    `kept_local` files and folders (traces over the upload cap)."""
    kept = {Path(path).resolve() for path in kept_local}
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir)
        skipped = relative.parts[0] in NOT_UPLOADED or path.resolve() in kept or kept.intersection(path.parents)
        if path.is_file() and not skipped:
            sink.log_artifact(path, str(Path(ARTIFACT_ROOT) / relative.parent))


def print_where_to_look(run_dir: Path, sink: TrackingSink | None, *, sending: bool = False) -> None:
    """Where the run went: its folder, its MLflow run and how to open it. `sending`: the sink delivers in the
    background; `print_mlflow_run` then says where the MLflow run is once it is there."""
    lines = [f"{PREFIX}run folder {run_dir}"]
    if sink is not None and sending:
        lines.append(
            f"{PREFIX}MLflow run at {redact_uri(sink.tracking_uri)}: sent in the background, "
            "before the process exits (anemoi_profiler.wait_for_mlflow() waits for it)"
        )
    elif sink is not None:
        lines.extend(_mlflow_run_lines(run_dir, sink))
    print("\n".join(lines), flush=True)


def print_mlflow_run(run_dir: Path, sink: TrackingSink) -> None:
    """The MLflow run of `run_dir` and how to open it, once the sink has delivered it."""
    print("\n".join(_mlflow_run_lines(run_dir, sink)), flush=True)


def _mlflow_run_lines(run_dir: Path, sink: TrackingSink) -> list[str]:
    if sink.run_id is None:
        return [
            f"{PREFIX}no MLflow run was made at {redact_uri(sink.tracking_uri)} (the warnings above say why); "
            f"the measurements wait in the run folder's spool: send them with: anemoi-profiler sync {run_dir}"
        ]
    lines = [f"{PREFIX}MLflow run {sink.run_id} at {redact_uri(sink.tracking_uri)}"]
    link = run_url(sink.tracking_uri, sink.experiment_id, sink.run_id)
    if link:
        lines.append(f"{PREFIX}open it at {link}")
    elif sink.tracking_uri.startswith("sqlite:"):
        lines.append(f"{PREFIX}open it with: {mlflow_command()} ui --backend-store-uri {sink.tracking_uri}")
        link = run_url(LOCAL_UI, sink.experiment_id, sink.run_id)
        if link:
            lines.append(f"{PREFIX}then go to {link}")
    return lines


def mlflow_command() -> str:
    """The `mlflow` of the running Python, by its absolute path, so that the printed command also runs from a
    shell whose PATH lacks the virtual environment; `python -m mlflow` when the environment has no script."""
    script = Path(sys.executable).parent / "mlflow"
    if script.is_file() and os.access(script, os.X_OK):
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m mlflow"
