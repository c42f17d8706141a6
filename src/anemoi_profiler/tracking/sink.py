"""The tracking sink: the training thread's only door to MLflow.

The training thread only puts records on a queue. A background thread writes each batch of records to the
spool folder first (write-ahead); a child process (`sender`), which that thread starts on its first request,
sends the spool and deletes the files, so that MLflow's Python never competes with the training loop for the
interpreter lock. Every wait of the training thread on them is bounded (`flush`, `close`). A
slow or dead server never blocks training, and nothing is lost: what could not be sent stays in
`<run folder>/spool/` and is sent when the server answers again, at the end of the run, or by
`anemoi-profiler sync <run folder>`. `close` can also return at once and leave the last sends to a closing
thread, which the process's exit waits for (it is no daemon) and `wait_for_mlflow` before that.
"""

from __future__ import annotations

import atexit
import itertools
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.logs import get_logger
from anemoi_profiler.redaction import redact_text, redact_uri
from anemoi_profiler.tracking.records import (
    Artifact,
    Batch,
    Description,
    FlushRequest,
    Metric,
    Params,
    Record,
    Tags,
    Terminate,
)
from anemoi_profiler.tracking.sender import REPLY_TIMEOUT_S, SenderError, SenderProcess
from anemoi_profiler.tracking.spool import pending_batches, remove_if_empty, write_batch, write_run_info

log = get_logger(__name__)

MAX_RECORDS_IN_MEMORY = 20000
WAKE_AT_QUEUED = 1000
"""Queued records at which the thread sends at once instead of at the next flush interval."""
MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param value."""
Queued = Record | FlushRequest

_closing: set[TrackingSink] = set()
"""Closed sinks whose delivery, or whose sender's end, no one has waited for yet (`wait_closed`)."""
_closing_lock = threading.Lock()


def wait_for_mlflow(timeout_s: float = 60.0) -> bool:
    """Wait until every profiled run of this process that is still being sent has reached MLflow (at most
    `timeout_s`). A fit that ends before its MLflow sender has started returns at once and leaves the delivery
    to the background: call this before reading such a run back from MLflow. False when a delivery it waited
    for is still going on at the timeout or left batches in its spool (a warning says where).

    Args:
        timeout_s: The most seconds to wait, for all runs together.

    Returns:
        True when everything waited for reached MLflow.
    """
    return _wait_for_deliveries(timeout_s)


def _wait_for_deliveries(timeout_s: float, but: TrackingSink | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    with _closing_lock:
        sinks = [sink for sink in _closing if sink is not but]
    results = [sink.wait_closed(max(0.0, deadline - time.monotonic())) for sink in sinks]
    return all(result is True for result in results)


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
        flush_interval_s: float = 5.0,
        retry_interval_s: float = 30.0,
        relay_requests: bool = False,
    ) -> None:
        """`relay_requests`: the sender copies a window request from the run's tags to the run folder."""
        self.spool_dir = spool_dir
        self.owns_run = run_id is None
        self.key_prefix = key_prefix
        self.flush_interval_s = flush_interval_s
        self.retry_interval_s = retry_interval_s
        spool_dir.mkdir(parents=True, exist_ok=True)
        write_run_info(
            spool_dir,
            {
                "tracking_uri": redact_uri(tracking_uri),  # no password on disk; `sync` asks MLflow's env for it
                "experiment": experiment,
                "run_id": run_id,
                "run_name": run_name,
                "relay_requests": relay_requests,
            },
        )
        self.tracking_uri = tracking_uri
        self._target = SenderProcess(spool_dir, tracking_uri)
        self._queue: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flush_requested = threading.Event()
        self._seq = itertools.count()
        self._offline_since: float | None = None
        self._last_attempt = 0.0
        self._said: set[object] = set()
        self._closer: threading.Thread | None = None
        self._delivered = threading.Event()
        self._all_sent = False
        self._unspooled = Batch()  # records the spool could not take (disk full): sent from memory
        self._spool_error: str | None = None
        self._dropped_metrics = 0
        self.started_up_at: float | None = None
        """`perf_counter` when the sender first answered (the run created, or MLflow found away): the end of
        the start-up work that runs beside the training's first steps."""
        self._thread = threading.Thread(target=self._loop, name="anemoi-profiler-tracking", daemon=True)
        self._thread.start()
        atexit.register(self._flush_at_exit)

    # ---- training-thread API: each call only enqueues ----
    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        timestamp_ms = timestamp_ms or int(time.time() * 1000)
        for key, value in metrics.items():
            self._queue.put(Metric(self._prefixed(key), value, timestamp_ms, step))
        self._wake_if_large()

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._queue.put(Params({k: str(v)[:MAX_PARAM_CHARS] for k, v in params.items()}))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags of the run, the profiler's own or a logger's; a later value of a key replaces the earlier one."""
        self._queue.put(Tags({k: str(v) for k, v in tags.items()}))

    def set_description(self, section: str) -> None:
        """The profiler's section of the run's description; the sender keeps the rest (the user's text) as it is."""
        self._queue.put(Description(section))

    def log_artifact(self, local_path: Path, artifact_dir: str = "") -> None:
        self._queue.put(Artifact(str(local_path), artifact_dir))

    @property
    def run_id(self) -> str | None:
        return self._target.run_id

    @property
    def experiment_id(self) -> str | None:
        """Known once the sender created or read the run; for the run's link in the MLflow UI."""
        return self._target.experiment_id

    def spool_now(self) -> None:
        """Write what is queued to the spool from the calling thread, even while the sink's thread waits on a slow
        server, so that a SIGKILL cannot lose it; a disk that refuses hands the records back to that thread."""
        refused = self._spool_queued()
        if refused is not None:
            self._queue.put(refused)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far was sent or spooled. True when nothing is left to send."""
        done = threading.Event()
        self._queue.put(FlushRequest(done))
        self._flush_requested.set()
        self._wake.set()
        return done.wait(timeout_s) and not pending_batches(self.spool_dir)

    @property
    def sender_up(self) -> bool:
        """True once the sender has answered (MLflow imported, the run created or the server found away)."""
        return self.started_up_at is not None

    def close(
        self,
        status: str | None = "FINISHED",
        timeout_s: float = 30.0,
        *,
        wait: bool = True,
        when_delivered: Callable[[], None] | None = None,
    ) -> bool | None:
        """Send everything (and end our own run with `status`); what does not get through stays spooled.

        With `wait`, returns when that is done: True when nothing is left in the spool. Without, returns None at
        once and a closing thread finishes the delivery, then calls `when_delivered`; the process's exit waits
        for that thread (it is not a daemon), and `wait_for_mlflow` waits for it before that.
        """
        if self._closer is None:
            if status and self.owns_run:
                self._queue.put(Terminate(status))
            self.spool_now()  # a scheduler's SIGKILL during the wait below then loses nothing
            self._stopping.set()
            self._wake.set()
            atexit.unregister(self._flush_at_exit)
            self._closer = threading.Thread(
                target=self._finish_closing, args=(timeout_s, when_delivered), name="anemoi-profiler-tracking-close"
            )
            with _closing_lock:
                _closing.add(self)
            self._closer.start()
        if not wait:
            return None
        self._delivered.wait()
        return self._all_sent

    def wait_closed(self, timeout_s: float) -> bool | None:
        """After `close`: wait until the delivery is done and the sender has ended. True when nothing is left in
        the spool, False when something is, None while the delivery goes on past `timeout_s`."""
        if self._closer is None:
            return None
        deadline = time.monotonic() + timeout_s
        self._closer.join(timeout_s)
        if self._closer.is_alive():
            return None
        if self._target.wait_ended(max(0.0, deadline - time.monotonic())):
            with _closing_lock:
                _closing.discard(self)
        return self._all_sent

    def _finish_closing(self, timeout_s: float, when_delivered: Callable[[], None] | None) -> None:
        """The closing thread: wait for the sink's thread (at most `timeout_s`), say what is left, end the sender."""
        try:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                # The server is too slow: kill the sender, which ends the thread's wait, and spool what came since.
                self._target.stop(grace_s=0.0)
                self._thread.join(5.0)
                refused = self._spool_queued()
                self._dropped_metrics += len(refused.metrics) if refused is not None else 0
            else:
                self._dropped_metrics += len(self._unspooled.metrics)
            self._all_sent = self._say_what_is_left()
            self._delivered.set()
            if when_delivered is not None:
                when_delivered()
        finally:
            self._delivered.set()
            # Last, and not waited for: the sender's own exit holds up neither `close` nor the process's exit.
            self._target.stop(wait=False)

    def _say_what_is_left(self) -> bool:
        """Warn of metrics lost and of batches left in the spool; True when nothing is left to send."""
        if self._dropped_metrics:
            log.warning(
                "%d metric point(s) could neither be sent to MLflow nor written to %s (%s); they are lost",
                self._dropped_metrics,
                self.spool_dir,
                self._spool_error,
            )
        left = pending_batches(self.spool_dir)
        if not left:
            remove_if_empty(self.spool_dir)  # the spool exists only while records wait for MLflow
            return True
        log.warning(
            "%d batch(es) of metrics/artifacts could not be sent to MLflow at %s; "
            "they are kept in %s. Send them with: anemoi-profiler sync %s",
            len(left),
            redact_uri(self.tracking_uri),
            self.spool_dir,
            self.spool_dir.parents[1],
        )
        return False

    # ---- background thread ----
    def _prefixed(self, key: str) -> str:
        # System metrics keep MLflow's own names so the UI's System metrics tab shows them.
        if not self.key_prefix or key.startswith(names.SYSTEM):
            return key
        return f"{self.key_prefix}-{key}"

    def _wake_if_large(self) -> None:
        if self._queue.qsize() >= WAKE_AT_QUEUED:
            self._wake.set()

    def _loop(self) -> None:
        # One delivery at a time: first what an earlier fit of this process left to the background (two senders
        # opening a new sqlite store at once both run MLflow's migrations, and one fails).
        _wait_for_deliveries(REPLY_TIMEOUT_S, but=self)
        self._attempt(create_run_only=True)
        self.started_up_at = time.perf_counter()
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping.is_set()
            self._attempt(force=stopping)
            if stopping:
                return

    def _drain(self) -> tuple[Batch, list[threading.Event]]:
        batch, flushes = Batch(), list[threading.Event]()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, flushes
            if isinstance(item, FlushRequest):
                flushes.append(item.done)
            else:
                batch.add(item)

    def _write_batch(self, drained: tuple[Batch, list[threading.Event]]) -> None:
        batch, flushes = drained
        if not batch.empty():
            write_batch(batch, self.spool_dir / f"batch-{time.time_ns():020d}-{next(self._seq):06d}.json")
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
            log.warning("tracking thread error (%s); will retry", redact_text(str(error)))

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
            log.warning_once(
                self._said,
                "spool",
                "cannot write the spool in %s (%s); metrics are sent to MLflow from memory "
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
                "MLflow at %s answers again after %.0f s; spooled metrics were sent",
                redact_uri(self.tracking_uri),
                time.monotonic() - self._offline_since,
            )
        self._offline_since = None

    def _mark_offline(self, error: BaseException) -> None:
        if self._offline_since is None:
            self._offline_since = time.monotonic()
        log.warning_once(
            self._said,
            "offline",
            "MLflow at %s is not reachable or answers with errors (%s: %s). Training goes on; "
            "metrics are kept in %s and sent when it answers (retry every %g s) or with: anemoi-profiler sync %s",
            redact_uri(self.tracking_uri),
            *_kind_and_reason(error),
            self.spool_dir,
            self.retry_interval_s,
            self.spool_dir.parents[1],
        )

    def _flush_at_exit(self) -> None:
        if self._closer is None:
            self._stopping.set()
            self._wake.set()
            self._thread.join(10.0)
            self._target.stop()


def _kind_and_reason(error: BaseException) -> tuple[str, str]:
    """The error's type and first line, redacted; for the sender's errors, the type it reported."""
    text = redact_text(str(error).splitlines()[0])[:200] if str(error) else ""
    kind, separator, reason = text.partition(": ")
    if isinstance(error, SenderError) and separator:
        return kind, reason
    return type(error).__name__, text
