"""The child process that sends the spool to MLflow, so that MLflow's Python never runs in the training process.

MLflow's client is pure Python: importing it takes 1.5 s of CPU or more, and sending one batch of a log
interval's metrics to a sqlite store about 10 ms (SQLAlchemy). In a thread of the training process, MLflow's own
asynchronous logging included, all of it would hold the interpreter lock that the training loop needs between
its operators; a call stuck on a server that does not answer could not be stopped either. In a child process it
costs the training nothing and can be killed. The sink's thread starts it on its first request and asks it for
one thing at a time (create the run, send the spool, send a batch) over its stdin; the answer is a JSON line on a
pipe of its own, read with a deadline (`REPLY_TIMEOUT_S`); MLflow's own prints go to stderr. The child ends when
its stdin closes, so it never outlives the training process.
Run as `python -m anemoi_profiler.tracking.sender <reply fd>` (see `_spawn`): this package imports neither torch
nor Lightning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from anemoi_profiler.logs import PREFIX, get_logger
from anemoi_profiler.redaction import redact_text
from anemoi_profiler.tracking.mlflow_target import MlflowTarget
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.spool import read_run_info, replay_spool

log = get_logger(__name__)

REPLY_TIMEOUT_S = 300.0
"""The longest the sink's thread waits for one answer (MLflow's import included in the first): past it the
sender is taken for stuck, killed, and the server for away; a later request starts a new one. MLflow's own HTTP
timeout and retries end a request to a server that does not answer well before."""


class SenderError(RuntimeError):
    """What the sender process reported ("<error type>: <first line>"), or that it died or did not answer."""


class SenderProcess:
    """The training process's handle on the sender: started on first use, started again if it died."""

    def __init__(self, spool_dir: Path, tracking_uri: str, reply_timeout_s: float = REPLY_TIMEOUT_S) -> None:
        self.spool_dir = spool_dir
        self.tracking_uri = tracking_uri
        self.reply_timeout_s = reply_timeout_s
        info = read_run_info(spool_dir)
        self.run_id: str | None = info.get("run_id")
        self.experiment_id: str | None = info.get("experiment_id")
        self._process: subprocess.Popen[str] | None = None
        self._replies: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._ending: threading.Thread | None = None

    def ensure_run(self) -> str | None:
        _succeeded(self._ask({"op": "ensure_run"}))
        return self.run_id

    def replay(self) -> None:
        """Send every spooled batch (see `spool.replay_spool`)."""
        _succeeded(self._ask({"op": "replay"}))

    def send(self, batch: Batch) -> None:
        """Send `batch`, removing from it what MLflow has taken (also when it fails part-way)."""
        reply = self._ask({"op": "send", "batch": batch.to_dict()})
        batch.take(Batch.from_dict(reply["batch"]))
        _succeeded(reply)

    def stop(self, grace_s: float = 2.0, *, wait: bool = True) -> None:
        """End the process: close its stdin, which ends it between requests, and kill it after `grace_s` (it may
        be stuck on a server that does not answer). A request waiting for it then gets its end of file.

        Without `wait`, a daemon thread waits for the end, so that the training process's own exit does not wait
        for the sender's (its interpreter unloading MLflow takes most of a second); `wait_ended` joins it.
        """
        process, replies = self._process, self._replies
        self._process = self._replies = None
        if process is None:
            return
        _close_stdin(process)
        if wait:
            _end(process, replies, grace_s)
        else:
            self._ending = threading.Thread(
                target=_end, args=(process, replies, grace_s), name="anemoi-profiler-sender-end", daemon=True
            )
            self._ending.start()

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) for a sender stopped without `wait` to end; True once it has."""
        if self._ending is not None:
            self._ending.join(timeout_s)
            return not self._ending.is_alive()
        return self._process is None

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            try:
                process, replies = self._started()
                assert process.stdin is not None
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
                line = _read_line(replies, time.monotonic() + self.reply_timeout_s)
            except TimeoutError:
                line, died = b"", f"no answer in {self.reply_timeout_s:g} s: stopped"
            except (OSError, ValueError) as error:
                line, died = b"", f"{type(error).__name__}: {error}"
            else:
                died = f"it exited with code {process.poll()}"
            if not line:
                self.stop(grace_s=0.0)
                raise SenderError(f"the MLflow sender process stopped ({died})")
        reply = json.loads(line)
        self.run_id = reply.get("run_id") or self.run_id
        self.experiment_id = reply.get("experiment_id") or self.experiment_id
        for message in reply.get("warnings", []):
            log.warning("%s", message)
        return reply

    def _started(self) -> tuple[subprocess.Popen[str], IO[bytes]]:
        if self._process is None or self._replies is None or self._process.poll() is not None:
            self.stop(grace_s=0.0)
            self._process, self._replies = _spawn()
            # The URI may hold credentials: it goes through the pipe, never on the command line (MLflow's settings
            # come with the environment).
            setup = {"spool_dir": str(self.spool_dir), "tracking_uri": self.tracking_uri}
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(setup) + "\n")
            self._process.stdin.flush()
        return self._process, self._replies


def _read_line(replies: IO[bytes], deadline: float) -> bytes:
    """One reply line; b"" at the end of file (the sender died); TimeoutError past `deadline`."""
    line = b""
    while not line.endswith(b"\n"):
        if not select.select([replies], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(replies.fileno(), 65536)
        if not chunk:
            return b""
        line += chunk
    return line


def _close_stdin(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()


def _end(process: subprocess.Popen[str], replies: IO[bytes] | None, grace_s: float) -> None:
    _close_stdin(process)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if replies is not None:
        with contextlib.suppress(OSError):
            replies.close()


def _spawn() -> tuple[subprocess.Popen[str], IO[bytes]]:
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(  # type: ignore[call-overload]  # mypy cannot match the `**` process_group
            [sys.executable, "-m", __name__, str(write_end)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            pass_fds=(write_end,),
            # A process group of its own, so that a Ctrl-C in the terminal is the training's to handle.
            **({"process_group": 0} if sys.version_info >= (3, 11) else {}),
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return process, os.fdopen(read_end, "rb", buffering=0)


def _succeeded(reply: dict[str, Any]) -> None:
    if not reply["ok"]:
        raise SenderError(reply["error"])


class _Warnings(logging.Handler):
    """Collects the sender's warnings, which go back with the reply and are logged by the training process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(redact_text(record.getMessage().removeprefix(PREFIX)))

    def take(self) -> list[str]:
        messages, self.messages = self.messages, []
        return messages


def serve(replies_fd: int) -> None:
    """The child's loop: a setup line, then one request per stdin line and one JSON reply per line on
    `replies_fd`, until stdin closes. MLflow is imported by the first request that needs it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training's Ctrl-C (on Python 3.10 it shares our group)
    line = sys.stdin.readline()
    if not line:
        return
    setup = json.loads(line)
    warnings = _Warnings()
    package_log = logging.getLogger("anemoi_profiler")
    package_log.addHandler(warnings)
    package_log.propagate = False
    _serve_run(MlflowTarget(Path(setup["spool_dir"]), setup["tracking_uri"]), os.fdopen(replies_fd, "w"), warnings)


def _serve_run(target: MlflowTarget, replies: IO[str], warnings: _Warnings) -> None:
    """Answer one run's requests until stdin closes."""
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any] = {"ok": True}
        batch = Batch.from_dict(request["batch"]) if request["op"] == "send" else None
        try:
            if target.info_unsaved:
                target.save_info()
            if request["op"] == "ensure_run":
                target.ensure_run()
            elif request["op"] == "replay":
                replay_spool(target.spool_dir, target)
            elif batch is not None:
                target.send(batch)
            if request["op"] in ("replay", "send"):
                target.relay_request()  # a window request in the run's tags, to the run folder
        except Exception as error:
            first_line = (str(error).splitlines() or [""])[0]
            reply = {"ok": False, "error": redact_text(f"{type(error).__name__}: {first_line}")}
        if batch is not None:
            reply["batch"] = batch.to_dict()
        reply.update(run_id=target.run_id, experiment_id=target.info.get("experiment_id"), warnings=warnings.take())
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
