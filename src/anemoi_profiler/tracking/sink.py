"""The tracking sink: the training thread's only door to MLflow.

The training thread only puts records on a queue. A background thread writes them, a batch per flush interval, to
the spool folder (write-ahead); a child process (`sender`) follows that folder and sends each batch, so that
MLflow's Python never competes with the training loop for the interpreter lock. The sender reports in
`sender.json` (the run id; MLflow away or back). There is one deadline: `close` marks the spool closed and waits at
most `tracking.close_timeout_s` for the sender to send the rest and end (a refused connection ends it at once),
then kills it. Nothing is lost: what was not sent stays in `<run folder>/spool/` for `anemoi-profiler sync`, and
one warning says why. `close(wait=False)` leaves that wait to a closing thread (`deliveries`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.logs import get_logger
from anemoi_profiler.redaction import redact_text, redact_uri
from anemoi_profiler.tracking import deliveries, sender
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
    drain,
)
from anemoi_profiler.tracking.spool import (
    LOG_FILE,
    count_metrics,
    pending_batches,
    read_status,
    remove_if_empty,
    write_batch,
    write_run_info,
)

log = get_logger(__name__)

MAX_RECORDS_IN_MEMORY = 20000
"""Queued records at which the thread writes at once; also the most a disk that refuses the spool keeps in memory."""
WAKE_AT_QUEUED = 1000
"""Queued records at which the thread writes at once instead of at the next flush interval."""
MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param value."""
STARTING_POLL_S = 0.1
"""How often the thread looks at `sender.json` until the sender is up (its start-up overlaps the first steps)."""


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
        close_timeout_s: float = 30.0,
        relay_requests: bool = False,
    ) -> None:
        """`relay_requests`: the sender copies a window request from the run's tags to the run folder.
        `close_timeout_s`: also how long the sender goes on if the training process ends without `close`."""
        self.spool_dir = spool_dir
        self.owns_run = run_id is None
        self.key_prefix = key_prefix
        self.flush_interval_s = flush_interval_s
        self.retry_interval_s = retry_interval_s
        self.close_timeout_s = close_timeout_s
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
        self._run_id = run_id
        self._experiment_id: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._process_lock = threading.Lock()
        self._given_up = False  # the closing thread is done with the sender: start none
        self._status: dict[str, Any] = {}
        self._warnings_seen = 0
        self._queue: queue.SimpleQueue[Record | FlushRequest] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flush_requested = threading.Event()
        self._seq = itertools.count()
        self._offline_since: float | None = None
        self._away_said = False
        self._last_write = 0.0
        self._said: set[object] = set()
        self._closer: threading.Thread | None = None
        self._delivered = threading.Event()
        self._all_sent = False
        self._unspooled = Batch()  # records the spool could not take (disk full): handed to the sender's stdin
        self._spool_error: str | None = None
        self._dropped_metrics = 0
        self.started_up_at: float | None = None
        """`perf_counter` when the sender first reported (the run created, or MLflow found away): the end of
        the start-up work that runs beside the training's first steps."""
        self._thread = threading.Thread(target=self._loop, name="anemoi-profiler-tracking", daemon=True)
        self._thread.start()
        atexit.register(self._flush_at_exit)

    # ---- training-thread API: each call only enqueues ----
    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        timestamp_ms = timestamp_ms or int(time.time() * 1000)
        for key, value in metrics.items():
            self._queue.put(Metric(self._prefixed(key), value, timestamp_ms, step))
        if self._queue.qsize() >= WAKE_AT_QUEUED:
            self._wake.set()

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
        return self._run_id or read_status(self.spool_dir).get("run_id")

    @property
    def experiment_id(self) -> str | None:
        """Known once the sender created or read the run; for the run's link in the MLflow UI."""
        return self._experiment_id or read_status(self.spool_dir).get("experiment_id")

    def spool_now(self) -> None:
        """Write what is queued to the spool from the calling thread, even while the sink's thread is busy, so
        that a SIGKILL cannot lose it; a disk that refuses hands the records back to that thread."""
        batch, flushes = drain(self._queue)
        try:
            self._write(batch)
        except OSError as error:
            self._spool_error = self._spool_error or f"{type(error).__name__}: {error}"
            self._queue.put(batch)
        finally:
            for done in flushes:
                done.set()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far was spooled and the sender has sent the spool (or found MLflow
        away). True when nothing is left to send."""
        deadline = time.monotonic() + timeout_s
        done = threading.Event()
        self._queue.put(FlushRequest(done))
        self._flush_requested.set()
        self._wake.set()
        if not done.wait(timeout_s):
            return False
        while time.monotonic() < deadline and self._sender_running():
            state = read_status(self.spool_dir).get("state")
            if state == "away" or (state == "up" and not pending_batches(self.spool_dir)):
                break
            time.sleep(0.05)
        return not pending_batches(self.spool_dir)

    @property
    def sender_up(self) -> bool:
        """True once the sender has reported (MLflow imported, the run created or the server found away)."""
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
            deliveries.add(self)
            self._closer.start()
        if not wait:
            return None
        self._delivered.wait()
        return self._all_sent

    def wait_closed(self, timeout_s: float | None) -> bool | None:
        """After `close`: wait until the delivery is done and the sender has ended. True when nothing is left in
        the spool, False when something is, None while the delivery goes on past `timeout_s`."""
        if self._closer is None:
            return None
        self._closer.join(timeout_s)
        if self._closer.is_alive():
            return None
        deliveries.discard(self)
        return self._all_sent

    def _finish_closing(self, timeout_s: float, when_delivered: Callable[[], None] | None) -> None:
        """The closing thread: the one deadline. Wait for the sink's thread to write the last batch and close the
        spool, then for the sender to send what is left and end; kill it at the deadline; say what is left."""
        deadline = time.monotonic() + timeout_s
        killed = False
        try:
            self._thread.join(timeout_s)
            with self._process_lock:
                self._given_up = True
                process = self._process
            if process is not None:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    killed = True
                with contextlib.suppress(OSError):
                    if process.stdin is not None:
                        process.stdin.close()
            if self._thread.is_alive():  # a thread still waiting on something: spool what came since
                self.spool_now()
            self._read_status()
            self._all_sent = self._say_what_is_left(timeout_s if killed else None)
            self._delivered.set()
            if when_delivered is not None:
                when_delivered()
        finally:
            self._delivered.set()

    def _say_what_is_left(self, killed_after_s: float | None) -> bool:
        """One warning: metrics lost, or why batches were left in the spool and how to send them. True when
        nothing is left to send."""
        lost = self._dropped_metrics + len(self._unspooled.metrics) + int(self._status.get("lost_metrics") or 0)
        if lost:
            log.warning(
                "%d metric point(s) could neither be sent to MLflow nor written to %s (%s); they are lost",
                lost,
                self.spool_dir,
                self._spool_error,
            )
        left = pending_batches(self.spool_dir)
        if not left:
            remove_if_empty(self.spool_dir)  # the spool exists only while records wait for MLflow
            return True
        if killed_after_s is not None:
            why = f"not done within tracking.close_timeout_s ({killed_after_s:g} s)"
        elif self._status.get("state") == "away":
            why = str(self._status.get("reason"))
        elif self._process is None or self._status.get("state") is None:
            why = f"the sender did not start (see {self.spool_dir / LOG_FILE})"
        else:
            why = f"the sender ended early (see {self.spool_dir / LOG_FILE})"
        log.warning(
            "MLflow at %s: %s; %d metric point(s) kept in %s; send them with: anemoi-profiler sync %s",
            redact_uri(self.tracking_uri),
            why,
            count_metrics(left),
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

    def _loop(self) -> None:
        # One delivery at a time: first what an earlier fit of this process left to the background (two senders
        # opening a new sqlite store at once both run MLflow's migrations, and one fails). Each is bounded by its
        # own close deadline.
        deliveries.wait(None, but=self)
        self._start_sender()
        while True:
            stopping = self._stopping.is_set()
            try:
                self._read_status()
                self._write_if_due(force=stopping)
                if stopping:
                    if self._process is not None:
                        sender.tell(self._process, {"close": True})
                    return
            except Exception as error:  # the sink must never die: a dead thread would silently drop metrics
                log.warning("tracking thread error (%s); will retry", redact_text(str(error)))
                if stopping:
                    return
            self._wake.wait(STARTING_POLL_S if self.started_up_at is None else self.flush_interval_s)
            self._wake.clear()

    def _start_sender(self) -> None:
        setup = {
            "tracking_uri": self.tracking_uri,  # may hold credentials: through the pipe, never a command line
            "flush_interval_s": self.flush_interval_s,
            "retry_interval_s": self.retry_interval_s,
            "close_timeout_s": self.close_timeout_s,
        }
        with self._process_lock:
            if self._given_up:
                return
            try:
                self._process = sender.start(self.spool_dir, setup)
            except OSError as error:
                log.warning("cannot start the MLflow sender (%s); metrics are kept in %s", error, self.spool_dir)

    def _sender_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _read_status(self) -> None:
        """What the sender wrote of itself: the run, its warnings, MLflow going away or coming back."""
        status = read_status(self.spool_dir)
        self._status = status or self._status
        self._run_id = self._run_id or status.get("run_id")
        self._experiment_id = self._experiment_id or status.get("experiment_id")
        new = int(status.get("warning_count") or 0) - self._warnings_seen
        if new > 0:
            for message in (status.get("warnings") or [])[-new:]:
                log.warning("%s", message)
            self._warnings_seen += new
        reported = status.get("state") in ("up", "away") or (self._process is not None and not self._sender_running())
        if self.started_up_at is None and (reported or self._process is None):
            self.started_up_at = time.perf_counter()
        if self._stopping.is_set():
            return  # the end says what is left, once
        state, now = status.get("state"), time.monotonic()
        if state == "away" and self._offline_since is None:
            self._offline_since = now
        away_s = now - (self._offline_since or now)
        if state == "away" and not self._away_said and away_s >= self.retry_interval_s:
            # Said while the fit goes on only after a retry failed too: a short fit hears the cause once, at its end.
            self._away_said = True
            log.warning(
                "MLflow at %s: %s. Training goes on; metrics are kept in %s and sent when it answers "
                "(retry every %g s)",
                redact_uri(self.tracking_uri),
                status.get("reason"),
                self.spool_dir,
                self.retry_interval_s,
            )
        elif state == "up" and self._offline_since is not None:
            if self._away_said:
                log.warning(
                    "MLflow at %s answers again after %.0f s; spooled metrics were sent",
                    redact_uri(self.tracking_uri),
                    away_s,
                )
            self._offline_since, self._away_said = None, False

    def _write_if_due(self, force: bool) -> None:
        """Write what is queued to the spool every flush interval; while MLflow is away, every retry interval (or
        when many records wait, or someone asks for a flush), so an outage does not make thousands of files."""
        interval = self.retry_interval_s if self._offline_since is not None else self.flush_interval_s
        due = time.monotonic() - self._last_write >= interval or self._flush_requested.is_set()
        if not (force or due or self._queue.qsize() >= MAX_RECORDS_IN_MEMORY):
            return
        self._flush_requested.clear()
        self._last_write = time.monotonic()
        batch, flushes = drain(self._queue)
        self._unspooled.merge(batch)
        if not self._unspooled.empty():
            try:
                self._write(self._unspooled)
                self._unspooled = Batch()
            except OSError as error:
                self._refused(error)
        for done in flushes:
            done.set()

    def _refused(self, error: OSError) -> None:
        """The disk refuses the spool (full, read-only): hand the records to the sender through its stdin; only
        if it is gone too are the oldest dropped beyond MAX_RECORDS_IN_MEMORY, so memory stays bounded."""
        self._spool_error = f"{type(error).__name__}: {error}"
        log.warning_once(
            self._said,
            "spool",
            "cannot write the spool in %s (%s); metrics are sent to MLflow from memory "
            "and are lost only if MLflow is away too",
            self.spool_dir,
            self._spool_error,
        )
        if self._process is not None and sender.tell(self._process, {"batch": self._unspooled.to_dict()}):
            self._unspooled = Batch()
            return
        excess = len(self._unspooled.metrics) - MAX_RECORDS_IN_MEMORY
        if excess > 0:
            del self._unspooled.metrics[:excess]
            self._dropped_metrics += excess

    def _write(self, batch: Batch) -> None:
        if not batch.empty():
            write_batch(batch, self.spool_dir / f"batch-{time.time_ns():020d}-{next(self._seq):06d}.json")

    def _flush_at_exit(self) -> None:
        """The process ends without `close`: spool what is queued and close the spool. The sender sends it and
        ends by itself, within its deadline, once the process is gone."""
        if self._closer is None:
            self._stopping.set()
            self._wake.set()
            self._thread.join(5.0)
