"""Short runs: the MLflow sender starts with the fit, beside its first steps, and ends with it; the report says
when measured steps overlapped that start-up; every wait on the sender is bounded.

What is timed (the 2 s target of a short fit) is the benchmark harness's, never a test's; these tests check the
mechanisms with real fits, a real sqlite store and real processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import psutil
import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.clock.clock_callback import StageClockCallback
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.tracking.spool import pending_batches
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


def profiled(tmp_path: Path, *overrides: str) -> list[Any]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = ProfilerConfig.load(None, [f"output_dir={tmp_path / 'runs'}", f"tracking.uri={uri}", *overrides])
    return build_callbacks(config)


def report_data(callbacks: list[Any], section: str) -> dict[str, Any]:
    run_dir = callbacks[0].session.run_dir
    return json.loads((run_dir / "report.json").read_text())["sections"][section]["data"]


def ignores_sigint(pid: int) -> bool:
    """From the child's signal mask (Linux)."""
    ignored = int(Path(f"/proc/{pid}/status").read_text().split("SigIgn:")[1].split()[0], 16)
    return bool(ignored & (1 << (signal.SIGINT - 1)))


class BatchEndSpy(pl.Callback):
    """Another callback with a batch-end hook, and a look at the callback list while the fit runs."""

    def __init__(self) -> None:
        self.seen: list[type] = []
        self.callbacks: list[Any] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if not self.seen:
            self.callbacks = list(trainer.callbacks)
            self.seen = [type(callback) for callback in self.callbacks]


def children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_the_sender_starts_with_the_fit_and_ends_with_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before = children()
    callbacks = profiled(tmp_path, "report.html=false", "report.console=false", "throughput.warmup_steps=1")
    assert children() == before, "building the callbacks starts no process"
    spy = BatchEndSpy()
    train, _ = loaders(n_train=64)
    trainer([*callbacks, spy], max_steps=4).fit(TinyRegressor(), train)
    session = callbacks[0].session
    assert wait_for_mlflow()
    run = MlflowClient(session.tracking_uri).get_run(session.sink.run_id)
    assert run.info.status == "FINISHED" and names.SUMMARY_TRAIN_BATCHES_PER_SEC in run.data.metrics
    assert set(session.end_seconds) >= {"write the report", "close the MLflow sink", "upload the run folder"}
    assert children() == before, "the sender ended with the delivery"
    for callback in [*callbacks, *spy.callbacks]:  # Lightning's hooks are the classes' own, none set on an instance
        assert not [name for name in vars(callback) if name.startswith("on_")], type(callback).__name__
    out = capsys.readouterr().out
    assert f"MLflow run {run.info.run_id} at " in out  # at the end, or once delivered
    assert "start-up" not in out  # no note on the sender's start-up at the end


class WaitForTheSender(pl.Callback):
    """Holds the first step until the session's MLflow sender is up: a fit that outlasts its start-up."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        deadline = time.monotonic() + 120
        while not self.session.sink.sender_up and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.session.sink.sender_up


def test_a_fit_that_outlasts_the_senders_start_up_returns_with_its_run_in_mlflow(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    callbacks = profiled(tmp_path, "report.html=false", "report.console=false", "throughput.warmup_steps=1")
    session = callbacks[0].session
    train, _ = loaders(n_train=64)
    trainer([*callbacks, WaitForTheSender(session)], max_steps=4).fit(TinyRegressor(), train)
    # no wait_for_mlflow(): the run is there, ended, when fit() returns
    run = MlflowClient(session.tracking_uri).get_run(session.sink.run_id)
    assert run.info.status == "FINISHED"
    assert set(json.loads((session.run_dir / "metrics.json").read_text())) <= set(run.data.metrics)
    assert not (session.run_dir / "spool").exists()
    out = capsys.readouterr().out
    assert f"MLflow run {run.info.run_id} at " in out and "in the background" not in out


def test_a_sink_closed_without_waiting_delivers_in_the_background(tmp_path: Path) -> None:
    before = children()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = TrackingSink(uri, "anemoi-profiler", tmp_path / "spool", run_name="background")
    sink.log_metrics({"train/step_ms": 7.5}, step=3)
    delivered: list[str | None] = []
    closing = sink.close("FINISHED", timeout_s=120, wait=False, when_delivered=lambda: delivered.append(sink.run_id))
    assert closing is None
    assert wait_for_mlflow()
    assert delivered == [sink.run_id] and sink.run_id is not None
    run = MlflowClient(uri).get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"train/step_ms": 7.5}
    assert not (tmp_path / "spool").exists()
    assert children() == before, "the sender ended after the delivery"
    assert wait_for_mlflow(), "nothing left to wait for"


def test_short_fits_in_a_row_on_a_new_store_all_reach_mlflow(tmp_path: Path) -> None:
    """Each fit's sender waits for the deliveries earlier fits left to the background: two senders opening a new
    sqlite store at once would both run MLflow's migrations, and one would fail."""
    train, _ = loaders(n_train=64)
    for _ in range(2):
        callbacks = profiled(tmp_path, "report.html=false", "report.console=false", "system.enabled=false")
        trainer(callbacks, max_steps=4).fit(TinyRegressor(), train)
    assert wait_for_mlflow()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert [run.info.status for run in runs] == ["FINISHED", "FINISHED"]


def test_a_short_fit_whose_server_never_answers_ends_and_its_delivery_gives_up_in_bounded_time(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server takes the connection and never answers: the sender is never up, so the fit does not wait for
    it; the background delivery gives up after `tracking.close_timeout_s` and the metrics stay in the spool."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    before = children()
    with socket.create_server(("127.0.0.1", 0)) as silent:
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        overrides = [f"output_dir={tmp_path / 'runs'}", f"tracking.uri={uri}", "tracking.close_timeout_s=1"]
        config = ProfilerConfig.load(None, [*overrides, "report.html=false", "report.console=false"])
        callbacks = build_callbacks(config)
        train, _ = loaders(n_train=64)
        trainer(callbacks, max_steps=4).fit(TinyRegressor(), train)
        out = capsys.readouterr().out
        assert f"MLflow run at {uri}: sent in the background" in out
        assert wait_for_mlflow(timeout_s=60) is False  # gave up: the rest is in the spool
    run_dir = callbacks[0].session.run_dir
    assert pending_batches(run_dir / "spool" / "rank0")
    assert children() == before, "the stuck sender was killed"


def sender_pid(before: set[int]) -> int:
    (pid,) = children() - before
    return pid


def test_the_sender_is_out_of_the_trainings_ctrl_c(tmp_path: Path) -> None:
    before = children()
    sink = TrackingSink(f"sqlite:///{tmp_path / 'mlflow.db'}", "short", tmp_path / "spool", flush_interval_s=0.1)
    try:
        assert sink.flush(timeout_s=120) and sink.run_id
        pid = sender_pid(before)
        if sys.version_info >= (3, 11):
            assert os.getpgid(pid) == pid  # the terminal's Ctrl-C goes to the training's group
        assert ignores_sigint(pid)
        os.kill(pid, signal.SIGINT)  # what a Ctrl-C sends it on Python 3.10, where it shares our group
        sink.log_metrics({"m": 1.0}, step=1)
        assert sink.flush(timeout_s=60)  # the same sender sends it
        assert children() - before == {pid}
    finally:
        assert sink.close(timeout_s=60)
    assert children() == before
    assert MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(sink.run_id).data.metrics == {"m": 1.0}


def test_a_server_that_never_answers_costs_the_close_its_deadline_and_no_more(tmp_path: Path) -> None:
    """A server that takes the connection and never answers: `close` waits `timeout_s`, not MLflow's own HTTP
    timeout, then kills the sender; the metrics stay in the spool."""
    before = children()
    spool = tmp_path / "run" / "spool" / "rank0"
    with socket.create_server(("127.0.0.1", 0)) as silent:
        sink = TrackingSink(f"http://127.0.0.1:{silent.getsockname()[1]}", "short", spool, close_timeout_s=3)
        sink.log_metrics({"m": 1.0}, step=1)
        started = time.monotonic()
        assert sink.close(timeout_s=3) is False
        assert 3 <= time.monotonic() - started < 15
        assert children() == before
    assert pending_batches(spool)


def test_the_sender_ends_when_the_training_process_is_gone(tmp_path: Path) -> None:
    """A training process killed outright (no `close`, no exit handlers): the sender, stuck on a server that never
    answers, ends by its own deadline."""
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from anemoi_profiler.tracking.sink import TrackingSink\n"
        "sink = TrackingSink(sys.argv[1], 'e', Path(sys.argv[2]), flush_interval_s=0.1, close_timeout_s=2)\n"
        "sink.log_metrics({'m': 1.0}, step=1)\n"
        "time.sleep(2)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    spool = tmp_path / "run" / "spool" / "rank0"
    with socket.create_server(("127.0.0.1", 0)) as silent:
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        completed = subprocess.run([sys.executable, "-c", script, uri, str(spool)], timeout=180, check=False)
        assert completed.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 15
        while senders_of(spool) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not senders_of(spool), "the sender outlived its training process past its deadline"
    assert pending_batches(spool)


def senders_of(spool: Path) -> list[int]:
    """Processes whose command line names `spool`: its sender."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(spool) in (process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def test_a_short_run_says_its_measured_steps_overlapped_the_start_up(tmp_path: Path) -> None:
    callbacks = profiled(tmp_path, "report.html=false", "report.console=false", "throughput.warmup_steps=1")
    train, _ = loaders(n_train=16 * 10)
    trainer(callbacks, max_steps=10).fit(TinyRegressor(), train)
    throughput = report_data(callbacks, "Throughput")
    # ten tiny steps take milliseconds; importing MLflow in the sender takes most of a second
    assert throughput["train/startup_overlap_s"] > 0
    assert throughput["train/measured_s"] >= throughput["train/startup_overlap_s"]  # what the diagnosis weighs
    run_dir = callbacks[0].session.run_dir
    assert "ran beside the profiler's own start-up" in (run_dir / "report.txt").read_text()
    wait_for_mlflow()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.data.metrics[names.SUMMARY_TRAIN_STARTUP_OVERLAP_S] == pytest.approx(
        throughput["train/startup_overlap_s"]
    )


def test_no_start_up_work_no_overlap(tmp_path: Path) -> None:
    callbacks = profiled(tmp_path, "report.html=false", "report.console=false", "tracking.enabled=false")
    train, _ = loaders(n_train=16 * 10)
    trainer(callbacks, max_steps=10).fit(TinyRegressor(), train)
    assert "train/startup_overlap_s" not in report_data(callbacks, "Throughput")


def test_the_users_callback_list_gains_only_the_clock_callback(tmp_path: Path) -> None:
    """Other callbacks' time is timed by the trainer's profiler stand-in: no boundary callback goes into the list."""
    train, _ = loaders(n_train=64)
    callbacks = profiled(tmp_path, "tracking.enabled=false", "report.html=false", "report.console=false")
    before, after = BatchEndSpy(), BatchEndSpy()
    fit = trainer([before, *callbacks, after], max_steps=3)
    fit.fit(TinyRegressor(), train)
    added = [kind for kind in after.seen if kind not in {type(callback) for callback in (before, *callbacks, after)}]
    assert added == [StageClockCallback]
    assert not any(isinstance(callback, StageClockCallback) for callback in fit.callbacks)  # out at the end


SLOW_HOOK_S = 0.02


def test_another_callbacks_time_is_found_by_the_loop_timer(tmp_path: Path) -> None:
    class SlowBatchEnd(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(SLOW_HOOK_S)

    callbacks = profiled(tmp_path, "tracking.enabled=false", "report.html=false", "report.console=false")
    train, _ = loaders(n_train=16 * 20)
    trainer([*callbacks, SlowBatchEnd()], max_steps=20).fit(TinyRegressor(), train)
    timing = report_data(callbacks, "Step time and memory")
    assert timing["train/callbacks_ms"] >= SLOW_HOOK_S * 1000 * 0.9  # the sleep, after ours, in its hook's time
    assert timing["train/loop_ms"] < SLOW_HOOK_S * 1000 / 2  # and not in Lightning's loop
