"""The MLflow sender imports MLflow in idle time (Linux's SCHED_IDLE), out of the first steps' way; where no core is
ever idle that import starves, and a second sender at normal priority is raced against it after
`startup.RACE_AFTER_S` or as soon as the run ends. Real sender processes, a real sqlite store, a real fit, on cores
kept busy by real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.tracking import sender, startup
from anemoi_profiler.tracking.sender import SenderProcess
from anemoi_profiler.tracking.spool import write_run_info
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

pytestmark = pytest.mark.skipif(not startup.IDLE_SCHEDULING, reason="SCHED_IDLE is Linux's")


@contextmanager
def every_core_busy() -> Iterator[None]:
    """A busy loop per core at nice 5: a SCHED_IDLE thread gets (almost) nothing, a nice-0 or nice-10 one a share."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "import os; os.nice(5)\nwhile True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def sender_for(tmp_path: Path) -> SenderProcess:
    """A sender handle for a new run in a sqlite store, as the sink makes it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spool = tmp_path / "spool"
    spool.mkdir()
    write_run_info(spool, {"tracking_uri": uri, "experiment": "race", "run_id": None, "run_name": "race"})
    return SenderProcess(spool, uri)


def voluntary_switches() -> int:
    """How often the calling thread has gone to sleep (Linux)."""
    status = Path("/proc/thread-self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")).split()[1])


def idle_senders() -> list[psutil.Process]:
    """This process's living senders that import in idle time."""
    return [
        child
        for child in psutil.Process().children()
        if child.is_running() and child.status() != psutil.STATUS_ZOMBIE and "idle" in child.cmdline()[-2:]
    ]


def test_a_sender_on_quiet_cores_imports_in_idle_time_and_serves_alone(tmp_path: Path) -> None:
    sender.end_kept()
    target = sender_for(tmp_path)
    try:
        assert target.ensure_run()
        assert target._sender is not None and target._sender.idle and target._racer is None
    finally:
        target.stop()


def test_a_starved_idle_import_is_raced_after_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sender.end_kept()
    monkeypatch.setattr(startup, "RACE_AFTER_S", 1.0)
    target = sender_for(tmp_path)
    try:
        with every_core_busy():
            started, switches = time.monotonic(), voluntary_switches()
            run_id = target.ensure_run()
            waited, switches = time.monotonic() - started, voluntary_switches() - switches
        assert run_id and MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
        assert target._sender is not None and not target._sender.idle  # the racer, at nice 10, serves
        assert psutil.Process(target._sender.process.pid).nice() == os.nice(0) + sender.NICENESS
        assert waited >= 1.0  # it was started at the deadline, not before
        # The waiting thread slept until the deadline and until a sender answered: it did not wake up to look
        # (every 20 ms, it used to: 28 sleeps a second here, each a moment of a core the training may need).
        assert switches < 5 * waited, (switches, waited)
        assert idle_senders() == []  # the starved one was ended
    finally:
        target.stop()


def test_the_end_of_a_run_races_a_sender_at_the_trainings_priority(tmp_path: Path) -> None:
    sender.end_kept()
    target = sender_for(tmp_path)
    try:
        with every_core_busy():
            threading.Timer(0.5, target.hurry).start()  # the run ends half a second in
            started = time.monotonic()
            assert target.ensure_run()
            waited = time.monotonic() - started
        assert target._sender is not None and not target._sender.idle
        assert psutil.Process(target._sender.process.pid).nice() == os.nice(0)
        assert waited < startup.RACE_AFTER_S  # it did not wait for the deadline
        target.release()  # kept for the process's next run: at the sender's own priority again
        kept = startup.waiting()
        assert kept is not None and psutil.Process(kept.process.pid).nice() == os.nice(0) + sender.NICENESS
    finally:
        target.stop()
        sender.end_kept()


def test_a_short_fit_on_busy_cores_ends_without_waiting_for_the_starved_import(tmp_path: Path) -> None:
    """Before the race, such a fit waited out the sink's 30 s close while its sender's idle-time import starved."""
    sender.end_kept()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = ProfilerConfig.load(
        None, [f"output_dir={tmp_path / 'runs'}", f"tracking.uri={uri}", "report.html=false", "report.console=false"]
    )
    with every_core_busy():
        callbacks = build_callbacks(config)
        train, _ = loaders(n_train=64)
        trainer(callbacks, max_steps=4).fit(TinyRegressor(), train)
    session = callbacks[0].session
    assert session.end_seconds["close the MLflow sink"] < 20.0
    run = MlflowClient(uri).get_run(session.sink.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics
    kept = startup.waiting()
    assert kept is not None and not kept.idle  # the racer served the run and is kept for the next
    sender.end_kept()
