"""The tracking sink against real MLflow stores: sqlite, an unreachable server, a server killed mid-fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import mlflow
import psutil
import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.cli.main import main
from anemoi_profiler.run.folder import print_where_to_look
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.tracking import resolve_tracking_uri
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.tracking.spool import pending_batches
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer
from tests.helpers.mlflow_server import MlflowServer, free_port


@pytest.mark.stack
def test_sink_sends_batches_params_artifacts_and_ends_its_run(tmp_path: Path, sqlite_uri: str) -> None:
    artifact = tmp_path / "note.txt"
    artifact.write_text("hello")
    sink = TrackingSink(sqlite_uri, "sink-exp", tmp_path / "spool", run_name="r", flush_interval_s=0.2)
    for step in range(2500):  # more than one request's worth (1000 metrics)
        sink.log_metrics({"a": float(step)}, step=step)
    sink.log_params({"p": 1})
    sink.log_artifact(artifact, "profiler")
    assert sink.close("FINISHED", timeout_s=60)
    client = MlflowClient(sqlite_uri)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"p": "1"}
    assert [m.step for m in client.get_metric_history(sink.run_id, "a")] == list(range(2500))
    assert [a.path for a in client.list_artifacts(sink.run_id, "profiler")] == ["profiler/note.txt"]
    assert not pending_batches(tmp_path / "spool")


def test_tracking_uri_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_tracking_uri(None, None, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert resolve_tracking_uri(None, None, tmp_path) == "http://env:5000"
    assert resolve_tracking_uri(None, "http://logger:5000", tmp_path) == "http://logger:5000"
    assert resolve_tracking_uri("https://configured", "http://logger:5000", tmp_path) == "https://configured"


def test_unreachable_server_never_blocks_training_and_sync_replays_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    down = f"http://127.0.0.1:{free_port()}"
    config = ProfilerConfig.load(
        None,
        [
            f"output_dir={tmp_path / 'runs'}",
            f"tracking.uri={down}",
            "tracking.close_timeout_s=5",
            "tracking.flush_interval_s=0.2",
            "log_every_n_steps=2",
            "throughput.warmup_steps=0",
            "system.enabled=false",
            "report.console=false",
        ],
    )
    train, _ = loaders(n_train=160)
    fit = trainer(build_callbacks(config))
    started = time.perf_counter()
    fit.fit(TinyRegressor(), train)
    assert time.perf_counter() - started < 60
    wait_for_mlflow()  # the end's delivery, in the fit or in the background, gave up after close_timeout_s
    (folder,) = run_folders(tmp_path / "runs")
    assert pending_batches(folder / "spool" / "rank0"), "nothing was spooled"

    target = f"sqlite:///{tmp_path / 'replayed.db'}"
    assert main(["sync", str(folder), "--tracking-uri", target]) == 0
    assert not pending_batches(folder / "spool" / "rank0")
    client = MlflowClient(target)
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    history = client.get_metric_history(run.info.run_id, names.TRAIN_STEP_MS)
    assert [m.step for m in history] == [2, 4, 6, 8, 10]  # 10 batches, one point per 2: all there, once
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run.info.run_id, "profiler")} >= {"profiler/config.yaml"}
    # a second sync has nothing left to send and duplicates nothing
    assert main(["sync", str(folder), "--tracking-uri", target]) == 0
    assert len(client.get_metric_history(run.info.run_id, names.TRAIN_STEP_MS)) == 5


def test_unreachable_server_is_reported_once_with_the_replay_command(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    sink = TrackingSink(
        f"http://127.0.0.1:{free_port()}", "e", tmp_path / "run" / "spool" / "rank0", flush_interval_s=0.1
    )
    for step in range(20):
        started = time.perf_counter()
        sink.log_metrics({"m": 1.0}, step)
        assert time.perf_counter() - started < 0.1  # only enqueues: MLflow with retries takes seconds
        time.sleep(0.02)
    started = time.perf_counter()
    assert not sink.close("FINISHED", timeout_s=30)
    assert time.perf_counter() - started < 25, "the end waited for a server that refuses connections"
    (warning,) = [r.getMessage() for r in caplog.records if "anemoi-profiler sync" in r.getMessage()]
    assert "connection refused; 20 metric point(s) kept in" in warning
    assert caplog.text.count("connection refused") == 1  # a short life: the cause is said once, at the end
    assert "Error" not in caplog.text and "sender" not in caplog.text  # the cause, not the profiler's internals
    spooled = [json.loads(p.read_text()) for p in pending_batches(tmp_path / "run" / "spool" / "rank0")]
    assert sum(len(batch["metrics"]) for batch in spooled) == 20
    # Where to look names no run that was never made, and says how to send the spool once MLflow is there.
    print_where_to_look(tmp_path / "run", sink)
    printed = capsys.readouterr().out
    assert f"anemoi-profiler sync {tmp_path / 'run'}" in printed
    assert "MLflow run None" not in printed and "mlflow ui" not in printed


class ServerOutage(pl.Callback):
    """Kill the tracking server at one step and bring it back at a later one."""

    def __init__(self, server: MlflowServer, kill_at: int, restart_at: int) -> None:
        self.server, self.kill_at, self.restart_at = server, kill_at, restart_at

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.kill_at:
            self.server.stop()
        elif trainer.global_step == self.restart_at:
            self.server.start()


@pytest.mark.slow
@pytest.mark.stack
def test_server_killed_mid_fit_gets_every_metric_once_after_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    server = MlflowServer(tmp_path / "server")
    server.start()
    try:
        config = ProfilerConfig.load(
            None,
            [
                f"output_dir={tmp_path / 'runs'}",
                f"tracking.uri={server.uri}",
                "tracking.flush_interval_s=0.2",
                "tracking.retry_interval_s=0.5",
                "tracking.close_timeout_s=60",
                "log_every_n_steps=2",
                "throughput.warmup_steps=0",
                "system.interval_s=0.5",
                "report.console=false",
            ],
        )
        train, _ = loaders(n_train=30 * 16)
        fit = trainer([*build_callbacks(config), ServerOutage(server, kill_at=6, restart_at=18)])
        fit.fit(TinyRegressor(step_sleep_s=0.1), train)
        assert fit.global_step == 30

        # MLflow 2.x lists proxied artifacts through the process-global tracking URI (mlflow_versions)
        mlflow.set_tracking_uri(server.uri)
        wait_for_mlflow()
        client = MlflowClient(server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, names.TRAIN_SAMPLES_PER_SEC)]
        assert steps == list(range(2, 31, 2))  # none lost while the server was down, none duplicated
        assert {a.path for a in client.list_artifacts(run.info.run_id, "profiler")} >= {"profiler/report.json"}
        (folder,) = run_folders(tmp_path / "runs")
        assert not pending_batches(folder / "spool" / "rank0")
    finally:
        mlflow.set_tracking_uri(None)
        server.stop()


TRAIN_IN_A_FRESH_INTERPRETER = """
import sys
from anemoi_profiler import ProfilerConfig, build_callbacks
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

config = ProfilerConfig.load("simple", [f"output_dir={sys.argv[1]}", "report.console=false", "log_every_n_steps=4",
                                     "throughput.warmup_steps=0"])
train, _ = loaders(n_train=160)
trainer(build_callbacks(config), max_steps=10).fit(TinyRegressor(), train)
print("mlflow imported:", "mlflow" in sys.modules)
"""
"""A script that reads nothing back: its exit waits for the MLflow sender that the short fit left delivering."""


@pytest.mark.slow
@pytest.mark.stack
def test_mlflow_runs_outside_the_training_process(tmp_path: Path) -> None:
    """MLflow's client is pure Python: in the training process it would hold the interpreter lock the training
    loop needs. A fit with the embedded store must not even import it, and its metrics must still arrive."""
    repo = Path(__file__).resolve().parents[2]
    completed = subprocess.run(
        [sys.executable, "-c", TRAIN_IN_A_FRESH_INTERPRETER, str(tmp_path / "runs")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    for sign_of_a_thread_dying_at_exit in ("Traceback", "Exception ignored", "terminate called"):
        assert sign_of_a_thread_dying_at_exit not in completed.stderr, completed.stderr[-3000:]
    assert "mlflow imported: False" in completed.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, names.TRAIN_STEP_MS)] == [4, 8, 10]


OUTAGE_FIT = """
import json, os, sys, time
from anemoi_profiler import ProfilerConfig, build_callbacks
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

config = ProfilerConfig.load(None, [f"output_dir={sys.argv[1]}", f"tracking.uri={sys.argv[2]}", "report.console=false",
                                    "log_every_n_steps=2", "throughput.warmup_steps=0", "system.interval_s=0.2"])
callbacks = build_callbacks(config)
train, _ = loaders(n_train=160)
trainer(callbacks, max_steps=10).fit(TinyRegressor(step_sleep_s=0.05), train)
print(json.dumps({"fit_ended": time.time(), "run_dir": str(callbacks[0].session.run_dir)}), flush=True)
"""
"""A short fit whose MLflow server is not there; it reads nothing back, so its exit is the end of the profiler."""


def processes_naming(text: str) -> list[str]:
    """Command lines of the processes that name `text` (the run folder: the sender names its spool)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if text in cmdline:
            found.append(f"{process.pid}: {cmdline}")
    return found


@pytest.mark.slow
@pytest.mark.stack
def test_an_outage_leaves_nothing_behind_and_sync_sends_every_metric_later(tmp_path: Path) -> None:
    """A server that refuses connections: the process ends a few seconds after the fit, leaves no process behind
    and no traceback, says why once and how to send the spool; once a server is there, `sync` sends it all."""
    repo = Path(__file__).resolve().parents[2]
    port = free_port()
    started = subprocess.Popen(
        [sys.executable, "-c", OUTAGE_FIT, str(tmp_path / "runs"), f"http://127.0.0.1:{port}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = started.communicate(timeout=300)
    exited = time.time()
    assert started.returncode == 0, err[-3000:]
    (seen,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    run_dir = Path(seen["run_dir"])
    assert exited - seen["fit_ended"] < 10, f"the process ended {exited - seen['fit_ended']:.1f} s after the fit"
    assert not processes_naming(str(run_dir)), "a profiler process outlived the training"
    assert "Traceback" not in err, err[-3000:]
    (message,) = [line for line in err.splitlines() if "connection refused" in line]  # the cause, once
    assert f"MLflow at http://127.0.0.1:{port}: connection refused;" in message
    assert f"send them with: anemoi-profiler sync {run_dir}" in message
    assert "sender" not in err and "SenderError" not in err  # the cause, not the profiler's internals
    print(f"exit {exited - seen['fit_ended']:.1f} s after the fit; {message}")

    server = MlflowServer(tmp_path / "server", port=port)  # the server comes back where the spool says it is
    server.start()
    try:
        time.sleep(max(0.0, exited + 30 - time.time()))
        assert not processes_naming(str(run_dir)), "a profiler process is still there 30 s after the exit"
        synced = subprocess.run(
            [sys.executable, "-m", "anemoi_profiler.cli", "sync", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert synced.returncode == 0, synced.stderr[-3000:]
        client = MlflowClient(server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
        assert run.info.status == "FINISHED"
        for key, points in json.loads((run_dir / "metrics.json").read_text()).items():
            history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            assert [step for step, _ in history] == sorted(points["step"]), key
            assert [value for _, value in history] == pytest.approx(
                [value for _, value in sorted(zip(points["step"], points["value"], strict=True))]
            ), key
        assert not pending_batches(run_dir / "spool" / "rank0")
    finally:
        server.stop()
