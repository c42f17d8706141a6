"""The process that sends the spool to MLflow, so that MLflow's Python never runs in the training process.

MLflow's client is pure Python: with a sqlite store, logging one metric point costs about 0.6 ms of CPU
(SQLAlchemy), and importing MLflow several seconds. In a thread of the training process all of it holds
the interpreter lock that the training loop needs between its operators. In this child process it
costs the training nothing. The sink's thread asks it for one thing at a time (create the run, send the
spool, send a batch) over its stdin and reads the answer, a JSON line, from a pipe of its own; MLflow's
own prints go to stderr. The child ends when its stdin closes, so it never outlives the training process.
A run that ends well hands its sender back for the next run of the process (a `trainer.test()` after the fit,
the next fit in a notebook), which then starts with MLflow imported; one left idle for `IDLE_EXIT_S` ends.
Run as `python -m anemoi_profiler.tracking.sender <reply fd> <idle exit s> <niceness> idle|now [store module]`
(see `_spawn`): this package imports neither torch nor Lightning.
"""

from __future__ import annotations

import contextlib
import importlib
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

from ..redaction import redact_text
from . import startup
from .mlflow_target import MlflowTarget
from .records import Batch
from .spool import read_run_info, replay_spool

log = logging.getLogger(__name__)

NICENESS = 10
"""How much lower than the training's the sender's CPU priority is: its start-up (importing MLflow, a second
or more of CPU) goes to the training's first steps when cores are short."""
IDLE_EXIT_S = 600.0
"""How long a sender waits for a run (prestarted, or kept after one) before it ends, freeing its memory."""
DATABASE_SCHEMES = frozenset({"sqlite", "postgresql", "mysql", "mssql"})
"""MLflow's SQLAlchemy store schemes (a driver may follow a '+')."""


class SenderError(RuntimeError):
    """What the sender process reported ("<error type>: <first line>"), or that it died."""


class SenderProcess:
    """The training process's handle on the sender: started on first use, restarted if it died."""

    def __init__(self, spool_dir: Path, tracking_uri: str) -> None:
        self.spool_dir = spool_dir
        self.tracking_uri = tracking_uri
        info = read_run_info(spool_dir)
        self.run_id: str | None = info.get("run_id")
        self.experiment_id: str | None = info.get("experiment_id")
        self._sender: startup.Sender | None = None
        self._racer: startup.Sender | None = None
        self._lock = threading.Lock()
        self._hurry = threading.Event()
        self._wake_lock = threading.Lock()
        self._wake: tuple[int, int] | None = None
        """A pipe that `hurry` writes to while `_first_ready` waits: it sleeps until a sender answers, its
        deadline or the run's end, never waking up to look (the training's thread would lose its core to it)."""

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

    def hurry(self) -> None:
        """The run is ending and waits for the sender: race one at the training's priority now against a sender
        still importing MLflow in idle time (see `startup.RACE_AFTER_S`)."""
        self._hurry.set()
        with self._wake_lock:
            if self._wake is not None:
                os.write(self._wake[1], b"!")

    def release(self) -> None:
        """This run is done with the sender: keep it, MLflow imported, for the process's next run; stop it
        if it cannot take another (it failed, or a sender is kept already)."""
        sender = self._sender
        if sender is None or sender.process.poll() is not None:
            self.stop()
            return
        try:
            _succeeded(self._ask({"op": "release"}))
        except SenderError:
            self.stop()
            return
        if startup.keep_for_next_run(sender):
            self._sender = None
            _lower_priority(sender.process.pid)  # a racer started at the run's end ran at the training's own
        else:
            self.stop()

    def stop(self, grace_s: float = 2.0) -> None:
        """End the process (and one raced against it): close its stdin, which ends it between requests, and kill
        it after `grace_s` (it may be stuck on a server that does not answer)."""
        sender, racer = self._sender, self._racer
        self._sender = self._racer = None
        for ending in (sender, racer):
            if ending is not None:
                _end(ending.process, ending.replies, grace_s)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            try:
                process, replies = self._started()
                assert process.stdin is not None
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
                line = replies.readline()
            except (OSError, ValueError) as error:
                line = ""
                died = f"{type(error).__name__}: {error}"
            else:
                died = f"it exited with code {process.poll()}" if not line else ""
            if not line:
                self.stop()
                raise SenderError(f"the MLflow sender process stopped ({died})")
        reply = json.loads(line)
        self.run_id = reply.get("run_id") or self.run_id
        self.experiment_id = reply.get("experiment_id") or self.experiment_id
        for message in reply.get("warnings", []):
            log.warning("anemoi-profiler: %s", message)
        return reply

    def _started(self) -> tuple[subprocess.Popen[str], IO[str]]:
        if self._sender is None or self._sender.process.poll() is not None:
            self.stop()
            self._sender = startup.take_waiting() or _spawn(store_module_for(self.tracking_uri))
            if not self._sender.ready:
                self._sender = self._first_ready()
            # The URI and MLflow's settings may hold credentials: they go through the pipe, never on the command
            # line; a sender started earlier gets the settings of now.
            setup = {"spool_dir": str(self.spool_dir), "tracking_uri": self.tracking_uri, "mlflow_env": _mlflow_env()}
            assert self._sender.process.stdin is not None
            self._sender.process.stdin.write(json.dumps(setup) + "\n")
            self._sender.process.stdin.flush()
        return self._sender.process, self._sender.replies

    def _first_ready(self) -> startup.Sender:
        """Wait for the sender's "ready" line; for one importing in idle time, race a second sender at normal
        priority against it after `RACE_AFTER_S` or once the run ends (`hurry`), and keep the first ready."""
        with self._wake_lock:
            self._wake = os.pipe()
        try:
            while True:
                assert self._sender is not None and self._wake is not None
                racing = self._racer is not None or not self._sender.idle
                if not racing and self._late():
                    self._racer = _spawn(store_module_for(self.tracking_uri), idle=False, niceness=self._niceness())
                    racing = True
                waiting = [sender for sender in (self._sender, self._racer) if sender is not None]
                watched: list[IO[str] | int] = [*(sender.replies for sender in waiting), self._wake[0]]
                deadline = self._sender.started_at + startup.RACE_AFTER_S
                timeout = None if racing else max(0.0, deadline - time.monotonic())
                readable, _, _ = select.select(watched, [], [], timeout)
                for sender in waiting:
                    if sender.replies in readable and (kept := self._settle(sender, sender.replies.readline() != "")):
                        return kept
                if self._wake[0] in readable:
                    os.read(self._wake[0], 64)
        finally:
            with self._wake_lock:
                wake, self._wake = self._wake, None
            if wake is not None:
                for fd in wake:
                    os.close(fd)

    def _settle(self, sender: startup.Sender, ready: bool) -> startup.Sender | None:
        """`sender` answered: ready, it wins the race and is returned; at its end of file (it died), None: the
        other one, if any, is waited for."""
        other = self._racer if sender is self._sender else self._sender
        self._sender = self._racer = None
        if not ready:
            _end(sender.process, sender.replies, 0.0)
            if other is None:
                raise OSError(f"it exited with code {sender.process.poll()} before it was ready")
            self._sender = other
            return None
        if other is not None:
            _end(other.process, other.replies, 0.0)
        self._sender = sender._replace(ready=True)
        return self._sender

    def _late(self) -> bool:
        assert self._sender is not None
        return self._hurry.is_set() or time.monotonic() - self._sender.started_at >= startup.RACE_AFTER_S

    def _niceness(self) -> int:
        """The training waits for a racer started at the run's end: it gets the training's own priority."""
        return 0 if self._hurry.is_set() else NICENESS


def _lower_priority(pid: int) -> None:
    """Set the sender to `NICENESS` below this process (raising a child's nice value needs no privilege)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICENESS))


def prestart(likely_uri: str) -> None:
    """Start a sender now, for this process's next sink: it imports MLflow while the training sets up.

    Importing MLflow and opening its store take the sender more than a second; started when the callbacks
    are made rather than when the fit begins, that time overlaps building the model, the data and the
    Trainer. `likely_uri` (the sink may get another, a logger's) only tells which store's code to import
    too. A sender nobody takes ends when this process does (its stdin closes), or after `IDLE_EXIT_S`. A sender
    kept from the process's last run serves instead: nothing starts then.
    """
    try:
        startup.prestart(lambda: _spawn(store_module_for(likely_uri)))
    except Exception as error:  # e.g. no more processes: the sink starts its own sender when it needs one
        log.debug("anemoi-profiler: could not start the MLflow sender early (%s)", error)


def _mlflow_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith("MLFLOW_")}


def end_kept() -> None:
    """End the sender kept for this process's next run, now rather than when the process ends or after
    `IDLE_EXIT_S`: frees its memory (MLflow imported, about 200 MB), or makes the next run start cold."""
    taken = startup.take_waiting()
    if taken is not None:
        _end(taken.process, taken.replies, grace_s=5.0)


def _end(process: subprocess.Popen[str], replies: IO[str] | None, grace_s: float) -> None:
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if replies is not None:
        with contextlib.suppress(OSError):
            replies.close()


def store_module_for(tracking_uri: str) -> str | None:
    """MLflow's module for the store behind `tracking_uri`, when it is a database (sqlite, PostgreSQL, ...)."""
    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0].lower()
    return "mlflow.store.tracking.sqlalchemy_store" if scheme in DATABASE_SCHEMES else None


def _spawn(
    store_module: str | None = None,
    idle_exit_s: float = IDLE_EXIT_S,
    idle: bool | None = None,
    niceness: int = NICENESS,
) -> startup.Sender:
    """Start a sender; it lowers its own priority to `niceness` first thing and imports MLflow in idle time if
    `idle` (default: where `startup` can), see `serve`."""
    idle = startup.imports_in_idle_time() if idle is None else idle
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(  # type: ignore[call-overload]  # mypy cannot match the `**` process_group
            [
                sys.executable,
                "-m",
                __name__,
                str(write_end),
                str(idle_exit_s),
                str(niceness),
                "idle" if idle else "now",
                *([store_module] if store_module else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            pass_fds=(write_end,),
            # A process group of its own, so that a Ctrl-C in the terminal is the training's to handle; not a
            # session of its own: with Linux's scheduler autogroups (most distributions' default) that is a
            # scheduling group of its own too, which its nice level does not reach. Beside a fit that used
            # every core, its import then stalled the batches for 0.2 s at a time (see docs/benchmarks.md).
            **({"process_group": 0} if sys.version_info >= (3, 11) else {}),
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return startup.Sender(process, os.fdopen(read_end, "r"), time.monotonic(), idle)


def _succeeded(reply: dict[str, Any]) -> None:
    if not reply["ok"]:
        raise SenderError(reply["error"])


class _Warnings(logging.Handler):
    """Collects the sender's warnings, which go back with the reply and are logged by the training process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(redact_text(record.getMessage().removeprefix("anemoi-profiler: ")))

    def take(self) -> list[str]:
        messages, self.messages = self.messages, []
        return messages


def serve(replies_fd: int, idle_exit_s: float, niceness: int, idle: bool, store_module: str | None = None) -> None:
    """The child's loop: a "ready" line once MLflow is imported, then a setup line, then one request per stdin
    line, one JSON reply per line on `replies_fd`, until a request releases it for the next run's setup.

    It runs at a lower priority: importing MLflow and opening its store take more than a second of CPU at
    the very start of a run, which should go to the training's first steps when cores are short; with `idle` the
    import takes only idle time (`startup.import_in_idle_time`). It imports them before it reads its setup (see
    `prestart`), leanly (see `_import_mlflow`); `store_module` is the store's module to import with them, if known.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training's Ctrl-C (on Python 3.10 it shares our group)
    with contextlib.suppress(OSError):
        os.nice(niceness)
    if idle:
        startup.import_in_idle_time(lambda: _import_mlflow(store_module))
    else:
        _import_mlflow(store_module)
    replies = os.fdopen(replies_fd, "w")
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    warnings = _Warnings()
    package_log = logging.getLogger("anemoi_profiler")
    package_log.addHandler(warnings)
    package_log.propagate = False
    while (setup := _next_setup(idle_exit_s)) is not None:
        _apply_mlflow_env(setup.get("mlflow_env", {}))
        if not _serve_run(MlflowTarget(Path(setup["spool_dir"]), setup["tracking_uri"]), replies, warnings):
            return


def _next_setup(idle_exit_s: float) -> dict[str, Any] | None:
    """The next run's setup; None when the training process has ended (stdin closed). A sender that waits
    `idle_exit_s` for one ends there."""
    idle = threading.Timer(idle_exit_s, os._exit, (0,))
    idle.daemon = True
    idle.start()
    line = sys.stdin.readline()
    idle.cancel()
    return json.loads(line) if line else None


def _apply_mlflow_env(settings: dict[str, str]) -> None:
    """The training process's MLflow settings (credentials, timeouts) as they are for this run."""
    for name in [name for name in os.environ if name.startswith("MLFLOW_") and name not in settings]:
        del os.environ[name]
    os.environ.update(settings)


def _serve_run(target: MlflowTarget, replies: IO[str], warnings: _Warnings) -> bool:
    """Answer one run's requests; True when it released the sender, False when stdin closed."""
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
        if request["op"] == "release":
            return True
    return False


def _import_mlflow(store_module: str | None) -> None:
    """Import MLflow's client (and the store's module) as leanly as `startup` allows; what it leaves out comes
    back when this MLflow cannot do without it. A missing MLflow is reported by the first request."""
    with startup.collector_paused_and_frozen():
        try:
            with startup.leaving_out_datasets():
                _import_client(store_module)
        except ImportError:
            with contextlib.suppress(ImportError):
                _import_client(store_module)


def _import_client(store_module: str | None) -> None:
    from mlflow.tracking import MlflowClient  # noqa: F401

    if store_module:
        importlib.import_module(store_module)


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "idle", next(iter(sys.argv[5:]), None))
