"""An MLflow run reached through one client: what the sender process (and `sync`) run, never the training process."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

from anemoi_profiler.logs import get_logger
from anemoi_profiler.redaction import REDACTED, redact_text, redact_uri
from anemoi_profiler.tracking.mlflow_versions import (
    EXPERIMENT_KIND_TAG,
    MAX_TAG_VALUE_CHARS,
    PROXIED_ARTIFACTS_NEED_GLOBAL_URI_BEFORE,
    SQLITE_STORE_MAKES_MLRUNS_BEFORE,
    mlflow_version,
    sqlite_store_problem,
)
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.spool import read_run_info, write_run_info
from anemoi_profiler.tracking.uris import artifact_location_for
from anemoi_profiler.triggers.requests import REQUEST_TAG, relay_tag

log = get_logger(__name__)

MAX_METRICS_PER_REQUEST = 1000
MAX_PARAMS_PER_REQUEST = 100
MAX_TAGS_PER_REQUEST = 100
DESCRIPTION_TAG = "mlflow.note.content"
"""The tag MLflow shows as the run's Description (Markdown)."""
SECTION_START = "<!-- anemoi-profiler -->"
SECTION_END = "<!-- /anemoi-profiler -->"
"""Around the profiler's section of a description: a later write replaces what is between them, nothing else."""
CUT_NOTE = "\n\n*Cut to fit MLflow's limit on a description: the whole diagnosis is in report.html.*"
KEPT_TAGS = ("mlflow.source.git.commit",)
"""Tags a run keeps when it has them: MLflow's git context of the user's script is better than our working folder's."""
EXPERIMENT_TAGS = {EXPERIMENT_KIND_TAG: "custom_model_development"}
"""On experiments the profiler creates (never on the user's): MLflow's UI kind for model training."""
RELAY_INTERVAL_S = 5.0
"""Seconds between the sender's looks at the run's `profiler.request` tag (one `get_run`)."""
CREATE_KEY_TAG = "profiler.create_key"
"""Set on the run when it is created: how a retried create finds the run an unanswered one made."""
REFUSED_FOR_CONTENT = ("INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_ALREADY_EXISTS")
"""MLflow error codes of a request refused for what it holds, not because the server is away."""


def experiment_id(client: Any, tracking_uri: str, name: str) -> str:
    """The id of experiment `name`; created when missing, with `EXPERIMENT_TAGS` and the store's artifact location.
    An experiment another job creates at the same moment is taken, not an error."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(
                name, artifact_location=artifact_location_for(tracking_uri), tags=EXPERIMENT_TAGS
            )
        except MlflowException:
            experiment = client.get_experiment_by_name(name)  # another job created it a moment ago
            if experiment is None:
                raise
    return experiment.experiment_id


class MlflowTarget:
    """The run of a spool (`run.json`); creates it on first use if the spool has no run id yet."""

    def __init__(self, spool_dir: Path, tracking_uri: str | None = None) -> None:
        self.spool_dir = spool_dir
        self.info = read_run_info(spool_dir)
        self.tracking_uri = tracking_uri or _without_redacted_credentials(self.info["tracking_uri"])
        self.info_unsaved = False  # the run id is not in run.json yet: the disk refused it
        self._client: Any = None
        self._relayed_at = 0.0

    @property
    def run_id(self) -> str | None:
        return self.info.get("run_id")

    def client(self) -> Any:
        if self._client is None:
            if self.tracking_uri.startswith("sqlite:") and (problem := sqlite_store_problem()):
                raise RuntimeError(problem)
            import mlflow
            from mlflow.tracking import MlflowClient

            mlruns_there = Path("mlruns").exists()
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            version = mlflow_version()
            if version is not None and version < PROXIED_ARTIFACTS_NEED_GLOBAL_URI_BEFORE:
                mlflow.set_tracking_uri(self.tracking_uri)  # in the sender's or the CLI's process, never training's
            if not mlruns_there and version is not None and version < SQLITE_STORE_MAKES_MLRUNS_BEFORE:
                with contextlib.suppress(OSError):  # the empty ./mlruns MLflow 2.x's sqlite store made; never a file
                    Path("mlruns").rmdir()
        return self._client

    def ensure_run(self) -> str:
        if self.run_id:
            return self.run_id
        client = self.client()
        experiment_id = self._experiment_id(client)
        # A create whose answer was lost (the server went away mid-request) may still have made the run: an
        # earlier attempt's key finds it, so that a retry, or `sync` later, does not make a second run.
        key = self.info.get("create_key")
        found = key and client.search_runs(
            [experiment_id], filter_string=f"tags.`{CREATE_KEY_TAG}` = '{key}'", max_results=1
        )
        if found:
            run = found[0]
        else:
            key = key or uuid.uuid4().hex
            self.info["create_key"] = key
            self.save_info()
            # Tags come as records (`Tags`); run.json of 0.1.0 still names some to create the run with.
            tags = {**(self.info.get("tags") or {}), CREATE_KEY_TAG: key}
            run = client.create_run(experiment_id, run_name=self.info.get("run_name"), tags=tags)
        self.info["run_id"] = run.info.run_id
        self.info["experiment_id"] = experiment_id
        self.save_info()
        return run.info.run_id

    def save_info(self) -> None:
        """Record the run id in run.json, so that `sync` adds to this run; a full disk only delays it."""
        try:
            write_run_info(self.spool_dir, self.info)
            self.info_unsaved = False
        except OSError:
            self.info_unsaved = True

    def _experiment_id(self, client: Any) -> str:
        return experiment_id(client, self.tracking_uri, self.info["experiment"])

    def send(self, batch: Batch) -> None:
        """Send a batch request by request, removing from `batch` what MLflow has taken.

        A request MLflow refuses for its content (not for being away) is dropped with a warning, so one bad
        value cannot hold back the rest or end the run's status update. Params, tags and the description are
        checked against the run first: a param the run has with another value is skipped (MLflow refuses to
        change one), and the description is read, our section replaced, and written back.
        """
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.ensure_run()
        client = self.client()
        while batch.metrics:
            chunk = batch.metrics[:MAX_METRICS_PER_REQUEST]
            metrics = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in chunk]
            self._call(client.log_batch, run_id, metrics=metrics)
            del batch.metrics[: len(chunk)]
        logged_tags: dict[str, str] = {}
        if batch.params or batch.tags or batch.description is not None:
            run = client.get_run(run_id)
            self.info["experiment_id"] = run.info.experiment_id
            logged_tags = run.data.tags
            _drop_logged(batch.params, run.data.params)
            for key in KEPT_TAGS:
                if key in logged_tags:
                    batch.tags.pop(key, None)
        while batch.params:
            keys = list(batch.params)[:MAX_PARAMS_PER_REQUEST]
            self._call(client.log_batch, run_id, params=[Param(k, batch.params[k]) for k in keys])
            for k in keys:
                del batch.params[k]
        while batch.tags:
            keys = list(batch.tags)[:MAX_TAGS_PER_REQUEST]
            self._call(client.log_batch, run_id, tags=[RunTag(k, batch.tags[k]) for k in keys])
            for k in keys:
                del batch.tags[k]
        if batch.description is not None:
            current = logged_tags.get(DESCRIPTION_TAG, "")
            description = spliced_description(current, batch.description)
            if description is None:
                log.warning(
                    "the run's description leaves no room for the diagnosis within MLflow's "
                    "%d characters; it is in report.html",
                    MAX_TAG_VALUE_CHARS,
                )
            elif description != current:
                self._call(client.set_tag, run_id, DESCRIPTION_TAG, description)
            batch.description = None
        while batch.artifacts:
            local_path, artifact_dir = batch.artifacts[0]
            if Path(local_path).exists():
                self._call(client.log_artifact, run_id, local_path, artifact_dir or None)
            batch.artifacts.pop(0)
        if batch.terminate:
            self._call(self._terminate, client, run_id, batch.terminate)
            batch.terminate = None

    def relay_request(self) -> None:
        """Rank 0's sender with triggers on, during the run: a window request in the run's tags goes to the run
        folder's file."""
        if not self.info.get("relay_requests") or not self.run_id:
            return
        if time.monotonic() - self._relayed_at < RELAY_INTERVAL_S:
            return
        self._relayed_at = time.monotonic()
        try:  # never a failed send for it: the batch went through
            tag = self.client().get_run(self.run_id).data.tags.get(REQUEST_TAG)
            if tag:
                relay_tag(self.spool_dir.parent.parent, tag)  # <run folder>/spool/rank0
        except Exception as error:
            log.debug("looking for a window request in the run's tags: %s", error)

    def _terminate(self, client: Any, run_id: str, status: str) -> None:
        """`set_terminated`, except that with credentials in the URI the run's URL is not printed to stdout:
        MLflow prints it with the password in it."""
        store = getattr(getattr(client, "_tracking_client", None), "store", None)
        if store is None or redact_uri(self.tracking_uri) == self.tracking_uri:
            client.set_terminated(run_id, status)
            return
        from mlflow.entities import RunStatus

        store.update_run_info(run_id, RunStatus.from_string(status), int(time.time() * 1000), None)

    @staticmethod
    def _call(fn: Any, *args: Any, **kwargs: Any) -> None:
        from mlflow.exceptions import MlflowException

        try:
            fn(*args, **kwargs)
        except MlflowException as error:
            if error.error_code in REFUSED_FOR_CONTENT:
                reason = redact_text(str(error).splitlines()[0])
                log.warning("MLflow refused a request, dropped it: %s", reason)
                return
            raise


def spliced_description(current: str, section: str, limit: int = MAX_TAG_VALUE_CHARS) -> str | None:
    """`current` with our section (between the markers) replaced, or appended when it has none; the rest of it
    unchanged. Our section is cut at a line to fit `limit`; None when the rest leaves it no room."""
    before, after = current, ""
    start = current.find(SECTION_START)
    if start >= 0:
        end = current.find(SECTION_END, start)
        before, after = current[:start], current[end + len(SECTION_END) :] if end >= 0 else ""
    separator = "" if not before or before.endswith("\n\n") else "\n" if before.endswith("\n") else "\n\n"
    room = limit - len(before) - len(separator) - len(after) - len(SECTION_START) - len(SECTION_END) - 2
    body = section.strip()
    if len(body) > room:
        if room < 2 * len(CUT_NOTE):
            return None
        cut = body[: room - len(CUT_NOTE)]
        body = (cut[: cut.rfind("\n")] if "\n" in cut else cut).rstrip() + CUT_NOTE
    return f"{before}{separator}{SECTION_START}\n{body}\n{SECTION_END}{after}"


def _drop_logged(params: dict[str, str], logged: dict[str, str]) -> None:
    """Remove from `params` what the run has: the same value needs no request, another one MLflow refuses."""
    clashing = sorted(key for key, value in params.items() if key in logged and logged[key] != value)
    for key in [key for key in params if key in logged]:
        del params[key]
    if clashing:
        log.warning(
            "the MLflow run already has param(s) %s with other values (MLflow keeps a param's "
            "first value); not logged again, the run folder's config.yaml has this run's",
            ", ".join(clashing),
        )


def _without_redacted_credentials(uri: str) -> str:
    """The URI recorded in run.json, minus the `***@` left of its credentials: MLflow then takes them from
    MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or give `sync --tracking-uri`)."""
    return uri.replace(f"://{REDACTED}@", "://", 1)
