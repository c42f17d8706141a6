"""The child process that sends the spool to MLflow, so that MLflow's Python never runs in the training process.

MLflow's client is pure Python: importing it takes seconds of CPU, and every send to a sqlite store runs
SQLAlchemy in Python. In a thread of the training process, MLflow's own
asynchronous logging included, all of it would hold the interpreter lock that the training loop needs between
its operators; a call stuck on a server that does not answer could not be stopped either. In a child process it
costs the training nothing and can be killed.

The child follows the spool folder: it creates the run, sends the batch files in order as the sink's thread writes
them and deletes each once MLflow has it, and writes what the training process needs to know back into the spool
(`sender.json`: the run id, whether MLflow answers and why not). Its stdin carries only the URI (it may hold
credentials: never on a command line), the batches a full disk refused, and the word that the spool is closed;
then the child sends what is left, once, and ends. The training process waits for that at most
`tracking.close_timeout_s`, then kills it. Stdin also closes when the training process is gone, however it ended:
the child then makes its last pass within the same deadline and ends, so it never outlives the training for long.
Gone without the close (SIGKILL, the OOM killer, a crash), it also ends the run as KILLED and writes the record of
the vanished process (`vanished`).

A failed attempt is not retried inside MLflow (no HTTP retries: a server that refuses connections is known away
at once); the child tries again every `retry_interval_s`, and the spool keeps everything meanwhile. Its stdout
and stderr go to `sender.log` in the spool: MLflow's prints and tracebacks never reach the user's terminal.
Run as `python -m anemoi_profiler.tracking.sender <spool folder>` (see `start`): this package imports neither
torch nor Lightning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import IO, Any

from anemoi_profiler.logs import PREFIX
from anemoi_profiler.redaction import redact_text
from anemoi_profiler.tracking.mlflow_target import MlflowTarget
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.spool import (
    LOG_FILE,
    STATUS_FILE,
    replay_spool,
    write_batch,
    write_run_info,
)
from anemoi_profiler.tracking.vanished import VanishWatch
from anemoi_profiler.tracking.wedge_watch import POLL_S, WedgeWatch

CHILD_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
"""MLflow retries a failed request up to 7 times with growing pauses (minutes against a server that refuses
connections); the sender's own loop retries instead, so an outage is known from the first attempt."""
DEFAULT_HTTP_TIMEOUT_S = "30"
"""MLFLOW_HTTP_REQUEST_TIMEOUT for the sender unless the user set one (MLflow's is 120 s)."""
WARNINGS_KEPT = 20


def start(spool_dir: Path, setup: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start the sender of `spool_dir`; `setup` (tracking_uri, flush_interval_s, retry_interval_s,
    close_timeout_s) goes as the first line of its stdin."""
    env = {**os.environ, **CHILD_ENV}
    env.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", DEFAULT_HTTP_TIMEOUT_S)
    try:
        output: IO[bytes] | int = open(spool_dir / LOG_FILE, "ab")  # noqa: SIM115  # the child keeps its own copy
    except OSError:
        output = subprocess.DEVNULL
    try:
        process = subprocess.Popen(  # type: ignore[call-overload]  # mypy cannot match the `**` process_group
            [sys.executable, "-m", __name__, str(spool_dir)],
            stdin=subprocess.PIPE,
            stdout=output,
            stderr=output,
            env=env,
            # A process group of its own, so that a Ctrl-C in the terminal is the training's to handle.
            **({"process_group": 0} if sys.version_info >= (3, 11) else {}),
        )
    finally:
        if not isinstance(output, int):
            output.close()
    tell(process, setup)
    return process


def tell(process: subprocess.Popen[bytes], message: dict[str, Any]) -> bool:
    """One line to the sender's stdin; False when it is gone."""
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()
    except (OSError, ValueError):
        return False
    return True


def describe(error: BaseException) -> str:
    """Why MLflow did not take a batch, in a few words: "connection refused" for a server that is not there,
    else the error's type and first line (redacted)."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(each) for each in chain)
    if any(isinstance(each, ConnectionRefusedError) for each in chain) or "Connection refused" in text:
        return "connection refused"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    if status := re.search(r"too many (\d+) error responses", text):  # urllib3, once MLflow's retries ran out
        return f"HTTP {status[1]} on every request"
    if status := re.search(r"failed with error code (\d+) != 200", text):  # MLflow, on the answer it got last
        return f"HTTP {status[1]} from the server"
    if "timed out" in text:
        return "no answer (timed out)"
    first_line = (str(error).splitlines() or [""])[0]
    return redact_text(f"{type(error).__name__}: {first_line}")[:300]


def probe(uri: str) -> None:
    """Raise ConnectionRefusedError when the http(s) server of `uri` refuses connections: known in milliseconds,
    without importing MLflow (seconds), so that the end of a short fit against a server that is not there is quick.
    Anything else (a proxy in the way, a name to look up, a slow answer) is left to MLflow's own attempt."""
    parsed = urllib.parse.urlsplit(uri)
    proxied = any(os.environ.get(name) for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy"))
    if parsed.scheme not in ("http", "https") or not parsed.hostname or proxied:
        return
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        socket.create_connection((parsed.hostname, port), timeout=5).close()
    except ConnectionRefusedError:
        raise
    except (OSError, ValueError):
        return


class _Status:
    """`sender.json`, rewritten on each change; a disk that refuses it loses only the news."""

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir
        self.values: dict[str, Any] = {"state": "starting", "reason": None, "warnings": [], "warning_count": 0}

    def update(self, **values: Any) -> None:
        if all(self.values.get(key) == value for key, value in values.items()):
            return
        self.values.update(values)
        with contextlib.suppress(OSError):
            write_run_info(self.spool_dir, self.values, STATUS_FILE)


class _Warnings(logging.Handler):
    """The sender's own warnings (a refused param, a description cut), for the training process to log."""

    def __init__(self, status: _Status) -> None:
        super().__init__(logging.WARNING)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        said = [*self.status.values["warnings"], redact_text(record.getMessage().removeprefix(PREFIX))]
        self.status.update(warnings=said[-WARNINGS_KEPT:], warning_count=self.status.values["warning_count"] + 1)


class _Stdin:
    """Reads the training process's lines: batches the disk refused, the close; end of file when it is gone."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.memory = Batch()
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.told_closed = False  # the training process said so: it did not vanish
        self.gone = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.stream:
            message = json.loads(line)
            if "batch" in message:
                with self.lock:
                    self.memory.merge(Batch.from_dict(message["batch"]))
            if message.get("close"):
                self.told_closed = True
                self.closed.set()
        self.gone.set()
        self.closed.set()

    def send_memory(self, target: MlflowTarget) -> None:
        """Send the batches the disk refused (newer than the spool files: after them)."""
        with self.lock:
            batch, self.memory = self.memory, Batch()
        try:
            if not batch.empty():
                target.send(batch)
        finally:
            with self.lock:
                batch.merge(self.memory)
                self.memory = batch


def serve(spool_dir: Path) -> None:
    """The child's loop: send the spool every `flush_interval_s` (every `retry_interval_s` while MLflow does not
    take it) until the training process closes the spool or is gone, then once more, and end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training's Ctrl-C (on Python 3.10 it shares our group)
    line = sys.stdin.buffer.readline()
    if not line:
        return
    setup = json.loads(line)
    stdin = _Stdin(sys.stdin.buffer)
    status = _Status(spool_dir)
    package_log = logging.getLogger("anemoi_profiler")
    package_log.addHandler(_Warnings(status))
    package_log.propagate = False

    def end_by_the_deadline() -> None:
        """Once the training process is gone (stdin closed; or reparented, should a forked data loader worker still
        hold the pipe), no one else will stop us: a last pass, and the end within the close deadline."""
        parent = os.getppid()
        while not stdin.gone.wait(1.0) and os.getppid() == parent:
            pass
        stdin.closed.set()
        time.sleep(setup["close_timeout_s"])
        os._exit(1)

    threading.Thread(target=end_by_the_deadline, daemon=True).start()
    target = MlflowTarget(spool_dir, setup["tracking_uri"])
    watch = VanishWatch(spool_dir)
    wedges = WedgeWatch(spool_dir)  # a training process that holds the interpreter lock cannot record its stall
    next_try = 0.0
    while True:
        closing = stdin.closed.is_set()  # before the files are listed: those written before the close are seen
        if closing or time.monotonic() >= next_try:
            try:
                if status.values["state"] != "up":
                    probe(target.tracking_uri)
                if target.info_unsaved:
                    target.save_info()
                target.ensure_run()
                status.update(run_id=target.run_id, experiment_id=target.info.get("experiment_id"))
                replay_spool(spool_dir, watch.noting(target))
                stdin.send_memory(target)
                target.relay_request()  # a window request in the run's tags, to the run folder
                status.update(state="up", reason=None, experiment_id=target.info.get("experiment_id"))
                next_try = time.monotonic() + setup["flush_interval_s"]
            except Exception as error:
                status.update(state="away", reason=describe(error))
                next_try = time.monotonic() + setup["retry_interval_s"]
            if closing:
                break
        wedges.poll(target)
        stdin.closed.wait(min(POLL_S, max(0.0, next_try - time.monotonic())))
    if not stdin.told_closed:  # SIGKILL, the OOM killer, a crash: no one else will end the run
        watch.finish(target)
    _keep_memory(spool_dir, stdin, status)


def _keep_memory(spool_dir: Path, stdin: _Stdin, status: _Status) -> None:
    """What the disk refused and MLflow did not take: into the spool if the disk takes it now, else lost."""
    if stdin.memory.empty():
        return
    try:
        write_batch(stdin.memory, spool_dir / f"batch-{time.time_ns():020d}-memory.json")
    except OSError:
        status.update(lost_metrics=len(stdin.memory.metrics))


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # not unloading MLflow (most of a second): the training process may be waiting for this exit
