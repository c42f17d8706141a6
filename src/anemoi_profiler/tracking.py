"""The tracking sink: the single place that talks to MLflow.

The training thread only puts records on a queue. A background thread writes each batch of records to the
spool folder first (write-ahead); a child process (`tracking_sender`) sends the spool and deletes the
files, so that MLflow's Python never competes with the training loop for the interpreter lock. A slow
or dead server never blocks training, and nothing is lost: what could not be sent stays in
`<run folder>/spool/` and is sent when the server answers again, at the end of the run, or by
`anemoi-profiler sync <run folder>`.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .redaction import REDACTED, redact_text, redact_uri

log = logging.getLogger(__name__)

MAX_METRICS_PER_REQUEST = 1000
MAX_PARAMS_PER_REQUEST = 100
MAX_RECORDS_IN_MEMORY = 20000
RUN_FILE = "run.json"


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


class SenderError(RuntimeError):
    """What the sender process reported ("<error type>: <first line>"), or that it died."""


@dataclass
class Batch:
    """Records waiting to be sent together; the unit written to the spool."""

    metrics: list[list[Any]] = field(default_factory=list)  # [key, value, timestamp_ms, step]
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[list[str]] = field(default_factory=list)  # [local_path, artifact_dir]
    terminate: str | None = None

    def merge(self, other: Batch) -> None:
        self.metrics += other.metrics
        self.params.update(other.params)
        self.tags.update(other.tags)
        self.artifacts += other.artifacts
        self.terminate = other.terminate or self.terminate

    def empty(self) -> bool:
        return not (self.metrics or self.params or self.tags or self.artifacts or self.terminate)

    @classmethod
    def read(cls, path: Path) -> Batch:
        return cls(**json.loads(path.read_text()))

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.__dict__))
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
            raise
        tmp.replace(path)


class MlflowTarget:
    """An MLflow run reached through one client; creates the run on first use if it has no id yet."""

    def __init__(self, spool_dir: Path, tracking_uri: str | None = None) -> None:
        self.spool_dir = spool_dir
        info = json.loads((spool_dir / RUN_FILE).read_text())
        self.tracking_uri = tracking_uri or _without_redacted_credentials(info["tracking_uri"])
        self.info = info
        self.info_unsaved = False  # the run id is not in run.json yet: the disk refused it
        self._client: Any = None

    @property
    def run_id(self) -> str | None:
        return self.info.get("run_id")

    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def ensure_run(self) -> str:
        if self.run_id:
            return self.run_id
        client = self.client()
        experiment_id = self._experiment_id(client)
        run = client.create_run(experiment_id, run_name=self.info.get("run_name"), tags=self.info.get("tags"))
        self.info["run_id"] = run.info.run_id
        self.info["experiment_id"] = experiment_id
        self.save_info()
        return run.info.run_id

    def save_info(self) -> None:
        """Record the run id in run.json, so that `sync` adds to this run; a full disk only delays it."""
        try:
            _write_run_file(self.spool_dir, self.info)
            self.info_unsaved = False
        except OSError:
            self.info_unsaved = True

    def _experiment_id(self, client: Any) -> str:
        from mlflow.exceptions import MlflowException

        name = self.info["experiment"]
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return client.create_experiment(name, artifact_location=artifact_location_for(self.tracking_uri))
            except MlflowException:
                experiment = client.get_experiment_by_name(name)  # another job created it a moment ago
                if experiment is None:
                    raise
        return experiment.experiment_id

    def send(self, batch: Batch) -> None:
        """Send a batch request by request, removing from `batch` what MLflow has taken.

        A request MLflow refuses for its content (not for being away) is dropped with a warning, so one bad
        value cannot hold back the rest or end the run's status update.
        """
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.ensure_run()
        client = self.client()
        while batch.metrics:
            chunk = batch.metrics[:MAX_METRICS_PER_REQUEST]
            metrics = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in chunk]
            self._call(client.log_batch, run_id, metrics=metrics)
            del batch.metrics[: len(chunk)]
        while batch.params:
            keys = list(batch.params)[:MAX_PARAMS_PER_REQUEST]
            self._call(client.log_batch, run_id, params=[Param(k, batch.params[k]) for k in keys])
            for k in keys:
                del batch.params[k]
        if batch.tags:
            self._call(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in batch.tags.items()])
            batch.tags.clear()
        while batch.artifacts:
            local_path, artifact_dir = batch.artifacts[0]
            if Path(local_path).exists():
                self._call(client.log_artifact, run_id, local_path, artifact_dir or None)
            batch.artifacts.pop(0)
        if batch.terminate:
            self._call(self._terminate, client, run_id, batch.terminate)
            batch.terminate = None

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
            if error.error_code in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_ALREADY_EXISTS"):
                reason = redact_text(str(error).splitlines()[0])
                log.warning("anemoi-profiler: MLflow refused a request, dropped it: %s", reason)
                return
            raise


def _kind_and_reason(error: BaseException) -> tuple[str, str]:
    """The error's type and first line, redacted; for the sender's errors, the type it reported."""
    text = redact_text(str(error).splitlines()[0])[:200] if str(error) else ""
    kind, separator, reason = text.partition(": ")
    if isinstance(error, SenderError) and separator:
        return kind, reason
    return type(error).__name__, text


def _without_redacted_credentials(uri: str) -> str:
    """The URI recorded in run.json, minus the `***@` left of its credentials: MLflow then takes them from
    MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or give `sync --tracking-uri`)."""
    return uri.replace(f"://{REDACTED}@", "://", 1)


def _write_run_file(spool_dir: Path, info: Mapping[str, Any]) -> None:
    tmp = spool_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(dict(info), indent=2))
    tmp.replace(spool_dir / RUN_FILE)


def pending_batches(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.glob("batch-*.json"))


def replay_spool(
    spool_dir: Path, tracking_uri: str | None = None, target: MlflowTarget | None = None
) -> tuple[int, int]:
    """Send every spooled batch, merged into as few requests as possible; return (files sent, files left).

    On failure the unsent remainder is written back in place of the first file, so order is kept and
    nothing is sent twice. An unreadable file is renamed `*.unreadable`, kept and counted as left. Used by the
    sink's thread and by `anemoi-profiler sync`.
    """
    target = target or MlflowTarget(spool_dir, tracking_uri)
    files = pending_batches(spool_dir)
    if not files:
        return 0, 0
    merged, unreadable = Batch(), 0
    for path in list(files):
        try:
            merged.merge(Batch.read(path))
        except (ValueError, TypeError) as error:  # spool files are written atomically: only a damaged disk
            kept = path.with_name(path.name + ".unreadable")
            path.replace(kept)
            files.remove(path)
            unreadable += 1
            log.warning("anemoi-profiler: spool file %s is unreadable (%s); kept as %s, not sent", path, error, kept)
    if not files:
        return 0, unreadable
    try:
        target.send(merged)
    except Exception as error:
        try:
            merged.write(files[0])
        except OSError:
            raise error from None  # a full disk: the files stay as they were; the store drops what it had already
        for path in files[1:]:
            path.unlink()
        raise
    for path in files:
        path.unlink()
    return len(files), unreadable


class TrackingSink:
    """Queue metrics, params and artifacts for one MLflow run; send them in batches off the training thread.

    Either reuses an existing run (`run_id`, e.g. a Lightning MLFlowLogger's) or creates its own run, in
    which case `close` marks it FINISHED/FAILED/KILLED. Never raises into the caller: a tracking failure is
    logged once as a warning and the data stays in the spool.
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        spool_dir: Path,
        *,
        run_id: str | None = None,
        run_name: str | None = None,
        key_prefix: str = "",
        tags: Mapping[str, str] | None = None,
        flush_interval_s: float = 5.0,
        retry_interval_s: float = 30.0,
    ) -> None:
        self.spool_dir = spool_dir
        self.owns_run = run_id is None
        self.key_prefix = key_prefix
        self.flush_interval_s = flush_interval_s
        self.retry_interval_s = retry_interval_s
        spool_dir.mkdir(parents=True, exist_ok=True)
        _write_run_file(
            spool_dir,
            {
                "tracking_uri": redact_uri(tracking_uri),  # no password on disk; `sync` asks MLflow's env for it
                "experiment": experiment,
                "run_id": run_id,
                "run_name": run_name,
                "tags": dict(tags or {}),
            },
        )
        self.tracking_uri = tracking_uri
        from .tracking_sender import SenderProcess  # it imports this module

        self._target = SenderProcess(spool_dir, tracking_uri)
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flush_requested = threading.Event()
        self._run_ready = threading.Event()
        self._seq = itertools.count()
        self._offline_since: float | None = None
        self._last_attempt = 0.0
        self._warned = False
        self._closed = False
        self._unspooled = Batch()  # records the spool could not take (disk full): sent from memory
        self._spool_error: str | None = None
        self._spool_warned = False
        self._dropped_metrics = 0
        self._thread = threading.Thread(target=self._loop, name="anemoi-profiler-tracking", daemon=True)
        self._thread.start()
        atexit.register(self._flush_at_exit)

    # ---- training-thread API: each call only enqueues ----
    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        timestamp_ms = timestamp_ms or int(time.time() * 1000)
        for key, value in metrics.items():
            self._queue.put(("metric", self._prefixed(key), value, timestamp_ms, step))
        self._wake_if_large()

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._queue.put(("params", {k: str(v)[:6000] for k, v in params.items()}))

    def log_artifact(self, local_path: Path, artifact_dir: str = "") -> None:
        self._queue.put(("artifact", str(local_path), artifact_dir))

    @property
    def run_id(self) -> str | None:
        return self._target.run_id

    def spool_now(self) -> None:
        """Write what is queued to the spool from the calling thread, even while the sink's thread waits on a slow
        server, so that a SIGKILL cannot lose it; a disk that refuses hands the records back to that thread."""
        refused = self._spool_queued()
        if refused is not None:
            self._queue.put(("batch", refused))

    def wait_for_run(self, timeout_s: float) -> str | None:
        """The run id once the background thread has created (or reached) the run; None if it could not."""
        self._run_ready.wait(timeout_s)
        return self.run_id

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far was sent or spooled. True when nothing is left to send."""
        done = threading.Event()
        self._queue.put(("flush", done))
        self._flush_requested.set()
        self._wake.set()
        return done.wait(timeout_s) and not pending_batches(self.spool_dir)

    def close(self, status: str | None = "FINISHED", timeout_s: float = 30.0) -> bool:
        """Send everything (and end our own run with `status`); what does not get through stays spooled.

        Returns True when nothing is left in the spool.
        """
        if self._closed:
            return not pending_batches(self.spool_dir)
        self._closed = True
        if status and self.owns_run:
            self._queue.put(("terminate", status))
        self.spool_now()  # a scheduler's SIGKILL during the wait below then loses nothing
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            # The server is too slow: kill the sender, which ends the thread's wait, and spool what came since.
            self._target.stop(grace_s=0.0)
            self._thread.join(5.0)
            refused = self._spool_queued()
            self._dropped_metrics += len(refused.metrics) if refused is not None else 0
        else:
            self._dropped_metrics += len(self._unspooled.metrics)
        self._target.stop()
        atexit.unregister(self._flush_at_exit)
        if self._dropped_metrics:
            log.warning(
                "anemoi-profiler: %d metric point(s) could neither be sent to MLflow nor written to %s (%s); "
                "they are lost",
                self._dropped_metrics,
                self.spool_dir,
                self._spool_error,
            )
        left = pending_batches(self.spool_dir)
        if left:
            log.warning(
                "anemoi-profiler: %d batch(es) of metrics/artifacts could not be sent to MLflow at %s; "
                "they are kept in %s. Send them with: anemoi-profiler sync %s",
                len(left),
                redact_uri(self.tracking_uri),
                self.spool_dir,
                self.spool_dir.parents[1],
            )
        return not left

    # ---- background thread ----
    def _prefixed(self, key: str) -> str:
        # System metrics keep MLflow's own names so the UI's System metrics tab shows them.
        if not self.key_prefix or key.startswith("system/"):
            return key
        return f"{self.key_prefix}-{key}"

    def _wake_if_large(self) -> None:
        if self._queue.qsize() >= MAX_METRICS_PER_REQUEST:
            self._wake.set()

    def _loop(self) -> None:
        self._attempt(create_run_only=True)
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping.is_set()
            self._attempt(force=stopping)
            if stopping:
                return

    def _drain(self) -> tuple[Batch, list[threading.Event]]:
        batch, flushes = Batch(), []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, flushes
            kind = item[0]
            if kind == "metric":
                batch.metrics.append(list(item[1:]))
            elif kind == "params":
                batch.params.update(item[1])
            elif kind == "tags":
                batch.tags.update(item[1])
            elif kind == "artifact":
                batch.artifacts.append([item[1], item[2]])
            elif kind == "terminate":
                batch.terminate = item[1]
            elif kind == "flush":
                flushes.append(item[1])
            elif kind == "batch":
                batch.merge(item[1])

    def _write_batch(self, drained: tuple[Batch, list[threading.Event]]) -> None:
        batch, flushes = drained
        if not batch.empty():
            batch.write(self.spool_dir / f"batch-{time.time_ns():020d}-{next(self._seq):06d}.json")
        for done in flushes:
            done.set()

    def _attempt(self, create_run_only: bool = False, force: bool = False) -> None:
        """Write what is queued to the spool, then send the spool, unless the server is known to be away.

        While it is away, records wait in memory until the next retry (or until there are many of them, or
        someone asks for a flush), so an outage does not turn into thousands of small spool files.
        """
        try:
            retry_due = time.monotonic() - self._last_attempt >= self.retry_interval_s
            send_now = self._offline_since is None or retry_due or force
            if not (send_now or self._flush_requested.is_set() or self._queue.qsize() >= MAX_RECORDS_IN_MEMORY):
                return
            self._flush_requested.clear()
            batch, flushes = self._drain()
            self._spool(batch)
            if send_now:
                self._last_attempt = time.monotonic()
                try:
                    if create_run_only:
                        self._target.ensure_run()
                    else:
                        self._target.replay()
                        if not self._unspooled.empty():
                            self._target.send(self._unspooled)  # newer than the spool files: after them
                    self._mark_online()
                except Exception as error:
                    self._mark_offline(error)
            for done in flushes:
                done.set()
        except Exception as error:  # the sink must never die: a dead thread would silently drop metrics
            log.warning("anemoi-profiler: tracking thread error (%s); will retry", redact_text(str(error)))
        finally:
            if self.run_id:
                self._run_ready.set()

    def _spool_queued(self) -> Batch | None:
        """From the calling thread: write what is queued to the spool; the batch the disk refused, or None."""
        batch, flushes = self._drain()
        try:
            self._write_batch((batch, []))
        except OSError as error:
            self._spool_error = self._spool_error or f"{type(error).__name__}: {error}"
            return batch
        finally:
            for done in flushes:
                done.set()
        return None

    def _spool(self, batch: Batch) -> None:
        """Write-ahead: put `batch` (and what an earlier failed write left) into a spool file.

        When the disk refuses (full, read-only), the records stay in memory and are sent from there; only
        if MLflow is away too are the oldest dropped beyond MAX_RECORDS_IN_MEMORY, so memory stays bounded.
        """
        self._unspooled.merge(batch)
        if self._unspooled.empty():
            return
        try:
            self._write_batch((self._unspooled, []))
        except OSError as error:
            self._spool_error = f"{type(error).__name__}: {error}"
            if not self._spool_warned:
                self._spool_warned = True
                log.warning(
                    "anemoi-profiler: cannot write the spool in %s (%s); metrics are sent to MLflow from memory "
                    "and are lost only if MLflow is away too",
                    self.spool_dir,
                    self._spool_error,
                )
            excess = len(self._unspooled.metrics) - MAX_RECORDS_IN_MEMORY
            if excess > 0:
                del self._unspooled.metrics[:excess]
                self._dropped_metrics += excess
            return
        self._unspooled = Batch()

    def _mark_online(self) -> None:
        if self._offline_since is not None:
            log.warning(
                "anemoi-profiler: MLflow at %s answers again after %.0f s; spooled metrics were sent",
                redact_uri(self.tracking_uri),
                time.monotonic() - self._offline_since,
            )
        self._offline_since = None

    def _mark_offline(self, error: BaseException) -> None:
        if self._offline_since is None:
            self._offline_since = time.monotonic()
        if not self._warned:
            self._warned = True
            log.warning(
                "anemoi-profiler: MLflow at %s is not reachable or answers with errors (%s: %s). Training goes on; "
                "metrics are kept in %s and sent when it answers (retry every %g s) or with: anemoi-profiler sync %s",
                redact_uri(self.tracking_uri),
                *_kind_and_reason(error),
                self.spool_dir,
                self.retry_interval_s,
                self.spool_dir.parents[1],
            )
        self._run_ready.set()

    def _flush_at_exit(self) -> None:
        if not self._closed:
            self._stopping.set()
            self._wake.set()
            self._thread.join(10.0)
            self._target.stop()
