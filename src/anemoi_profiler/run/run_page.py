"""What the MLflow run page says about a profiled run: searchable tags, the config as params, the description.

At the start, tags for what is known then (device, parallelism, versions, git commit), so that a run that
crashes can be found too, and the measurement-relevant config as `profiler.*` params; at the end, the verdicts
(`profiler.verdict`) and the diagnosis as the run's description. The same for the profiler's own run and
for the user's MLFlowLogger run: everything is prefixed `profiler.`, and the description is a marked
section that the sender process merges into whatever the user wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.redaction import redact
from anemoi_profiler.reports.description import run_description
from anemoi_profiler.reports.diagnosis import NotAssessed, Outcome, fired
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.run_files.layout import ARTIFACT_ROOT, REPORT_HTML, REPORT_JSON, REPORT_TXT
from anemoi_profiler.tracking.sink import TrackingSink

log = get_logger(__name__)

PREFIX = "profiler."
NO_VERDICT = "none"
"""`profiler.verdict` of a run that nothing limits."""
NOT_ASSESSED = "not-assessed"
"""`profiler.verdict` of a run whose data no check could read (timing off, no batch after the warmup)."""
UNLOGGED_CONFIG = ("output_dir", "tracking", "report")
"""Config keys that do not change what is measured (where it goes, how it is rendered): not params."""
VERSION_TAGS = {
    "anemoi-profiler": "version",
    "torch": "torch",
    "lightning": "lightning",
    "pytorch-lightning": "pytorch_lightning",
    "mlflow": "mlflow",
}
"""environment.json's package -> the `profiler.<name>` tag of its version."""
GIT_COMMIT_TAG = "mlflow.source.git.commit"


def start_tags(environment: Mapping[str, Any], run_dir: Path, device: str, device_count: int) -> dict[str, str]:
    """Tags known at the start: `device` is the torch device this rank trains on ("cuda:0", "cpu")."""
    tags: dict[str, Any] = {
        "device": device_name(environment, device),
        "device_count": device_count,
        "world_size": environment.get("world_size"),
        "nodes": environment.get("num_nodes"),
        "strategy": environment.get("strategy"),
        "precision": environment.get("precision"),
        "run_folder": str(run_dir),
    }
    packages = environment.get("packages") or {}
    tags.update({tag: packages.get(package) for package, tag in VERSION_TAGS.items()})
    tags["cuda"] = environment.get("cuda")
    found = {f"{PREFIX}{key}": str(value) for key, value in tags.items() if value not in (None, "")}
    if environment.get("git_commit"):
        found[GIT_COMMIT_TAG] = str(environment["git_commit"])
    return found


def device_name(environment: Mapping[str, Any], device: str) -> str:
    """The CUDA device's name (`NVIDIA H200`), else the device type (`cpu`, `mps`)."""
    kind, _, index = device.partition(":")
    if kind == "cuda":
        for found in environment.get("devices") or []:
            if found.get("index") == int(index or 0) and found.get("name"):
                return str(found["name"])
    return kind


def config_params(config: ProfilerConfig, run_dir: Path) -> dict[str, str]:
    """`profiler.<config key>` for what changes the measurement (values as in YAML), the config hash and the
    run folder. Secrets are redacted; MLflow's 6000 characters per value are the sink's."""
    params = {f"{PREFIX}config_hash": config.fingerprint(), f"{PREFIX}run_folder": str(run_dir)}
    for key, value in _leaves(redact(config.to_dict())):
        if key.split(".", 1)[0] not in UNLOGGED_CONFIG:
            params[f"{PREFIX}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return params


def start(
    sink: TrackingSink,
    config: ProfilerConfig,
    run_dir: Path,
    environment: Mapping[str, Any],
    device: str,
    device_count: int,
) -> None:
    """Rank 0 at the start: tags and params, in the run the sink writes to (the profiler's own or the user's).

    Never raises: without them the run still gets every measurement.
    """
    try:
        sink.set_tags(start_tags(environment, run_dir, device, device_count))
        sink.log_params(config_params(config, run_dir))
    except Exception as error:
        log.warning("no tags and params for the MLflow run: %s: %s", type(error).__name__, error)


def finish(sink: TrackingSink, config: ProfilerConfig, run: RunData, outcomes: dict[str, Outcome]) -> None:
    """Rank 0 at the end, after the report: the verdicts as a tag and the diagnosis (`diagnosis.assess` of the
    run read back) as the description."""
    sink.set_tags({f"{PREFIX}verdict": verdict_tag(outcomes)})
    sink.set_description(run_description(run, outcomes, _report_location(config, run.folder)))


def verdict_tag(outcomes: dict[str, Outcome]) -> str:
    """The ids of the verdicts that fire, most severe first, comma separated; `none` when nothing limits the run,
    `not-assessed` when no check had the data to say."""
    if all(isinstance(outcome, NotAssessed) for outcome in outcomes.values()):
        return NOT_ASSESSED
    return ",".join(verdict.id for verdict in fired(outcomes)) or NO_VERDICT


def _report_location(config: ProfilerConfig, run_dir: Path) -> str:
    if not (run_dir / REPORT_HTML).is_file():
        return f"{REPORT_TXT} and {REPORT_JSON} in the run folder `{run_dir}` ({REPORT_HTML} is off)"
    if config.tracking.upload_artifacts:
        return f"`{ARTIFACT_ROOT}/{REPORT_HTML}` in the run's Artifacts"
    return f"`{run_dir / REPORT_HTML}` (not uploaded: tracking.upload_artifacts is off)"


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
