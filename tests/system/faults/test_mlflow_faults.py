"""MLflow misbehaving: a server answering errors, a server taking seconds per request, a read-only store.

In each case the training thread only enqueues, the training ends with the weights it has without the
profiler, and every metric reaches MLflow exactly once: at once, after the fault, or through
`anemoi-profiler sync` from the spool that the warning names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anemoi_profiler import build_callbacks, names, wait_for_mlflow
from anemoi_profiler.cli.main import main
from anemoi_profiler.tracking.spool import pending_batches
from tests.helpers.mlflow_server import MlflowServer
from tests.system.faults.fault_helpers import (
    LogCallTimer,
    assert_same_weights,
    metric_steps,
    only_run,
    only_run_folder,
    quick_config,
    read_only_folder,
    seeded_fit,
)
from tests.system.faults.fault_servers import ErrorServer, SlowProxy

pytestmark = [pytest.mark.faults, pytest.mark.soak]  # a long suite: make soak (CI)

STEP_KEY = names.TRAIN_STEP_MS
TEN_BATCHES_LOGGED_EVERY_TWO = [2, 4, 6, 8, 10]


def forget_mlflow_connections() -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for engine in SqlAlchemyStore._engine_map.values():
        engine.dispose()
    SqlAlchemyStore._engine_map.clear()


def spool_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "anemoi-profiler sync" in r.getMessage()]


def test_server_answering_503_never_holds_up_training_and_sync_sends_every_metric_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    new_store: Callable[[Path], str],
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    timer = LogCallTimer(monkeypatch)
    with ErrorServer(503) as server, caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        config = quick_config(tmp_path / "runs", f"tracking.uri={server.uri}", "tracking.close_timeout_s=10")
        profiled = seeded_fit(build_callbacks(config))
        assert wait_for_mlflow() is False, "the end's delivery gave up: the rest is in the spool"
        assert server.requests > 0, "the sink never tried the server"
    timer.assert_tiny()
    assert_same_weights(profiled, seeded_fit([]))

    folder = only_run_folder(tmp_path / "runs")
    spool = folder / "spool" / "rank0"
    assert pending_batches(spool)
    (left,) = spool_warnings(caplog)  # at the end, once: no warning per retry
    assert str(spool) in left and f"anemoi-profiler sync {folder}" in left and "503" in left

    target = new_store(tmp_path / "later.db")
    assert main(["sync", str(folder), "--tracking-uri", target]) == 0
    assert main(["sync", str(folder), "--tracking-uri", target]) == 0  # nothing left: sends nothing twice
    run = only_run(target)
    assert run.info.status == "FINISHED"
    assert metric_steps(target, run.info.run_id, STEP_KEY) == TEN_BATCHES_LOGGED_EVERY_TWO
    assert not pending_batches(spool)


@pytest.mark.slow
def test_server_taking_a_second_per_request_costs_the_training_thread_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_server: MlflowServer
) -> None:
    """Every request waits 1 s in a proxy in front of a real `mlflow server`; training does not."""
    timer = LogCallTimer(monkeypatch)
    with SlowProxy(mlflow_server.uri, delay_s=1.0) as proxy:
        config = quick_config(
            tmp_path / "runs",
            f"tracking.uri={proxy.uri}",
            "tracking.experiment=slow-server",
            "tracking.close_timeout_s=120",
            "tracking.upload_artifacts=false",  # each file would be one more slow request
        )
        callbacks = build_callbacks(config)
        started = time.perf_counter()
        profiled = seeded_fit(callbacks, batches=20, step_sleep_s=0.02)
        assert wait_for_mlflow(timeout_s=180)
        seconds = time.perf_counter() - started
        requests = proxy.requests
    timer.assert_tiny()
    assert_same_weights(profiled, seeded_fit([], batches=20, step_sleep_s=0.02))
    # The end of the run (in the fit, or after it in the background) waited for the slow server, not the steps.
    assert requests >= 5 and seconds >= requests * 1.0 * 0.9

    run = only_run(mlflow_server.uri, "slow-server")
    assert run.info.status == "FINISHED"
    assert metric_steps(mlflow_server.uri, run.info.run_id, STEP_KEY) == list(range(2, 21, 2))
    assert not pending_batches(only_run_folder(tmp_path / "runs") / "spool" / "rank0")


def test_slow_server_past_close_timeout_leaves_the_rest_in_the_spool(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    new_store: Callable[[Path], str],
) -> None:
    """A server that never answers in time: the end of the run waits `close_timeout_s`, no longer."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with ErrorServer(503) as upstream, SlowProxy(upstream.uri, delay_s=30.0) as proxy:
        config = quick_config(tmp_path / "runs", f"tracking.uri={proxy.uri}", "tracking.close_timeout_s=2")
        with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
            started = time.perf_counter()
            seeded_fit(build_callbacks(config))
            assert wait_for_mlflow(timeout_s=60) is False
            seconds = time.perf_counter() - started
        assert seconds < 25, f"the end waited {seconds:.0f} s for a server that takes 30 s"
        folder = only_run_folder(tmp_path / "runs")
        assert pending_batches(folder / "spool" / "rank0")
        assert any(f"anemoi-profiler sync {folder}" in message for message in spool_warnings(caplog))


def test_read_only_sqlite_store_keeps_metrics_in_the_spool_until_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, new_store: Callable[[Path], str]
) -> None:
    store_folder = tmp_path / "store"
    uri = new_store(store_folder / "mlflow.db")
    config = quick_config(tmp_path / "runs", f"tracking.uri={uri}", "tracking.close_timeout_s=5")
    with read_only_folder(store_folder), caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        profiled = seeded_fit(build_callbacks(config))
        assert wait_for_mlflow() is False
        folder = only_run_folder(tmp_path / "runs")
        assert pending_batches(folder / "spool" / "rank0")
        assert any(f"anemoi-profiler sync {folder}" in message for message in spool_warnings(caplog))
        # MLflow keeps the connections it opened on the read-only store for the life of the process; the user
        # runs `anemoi-profiler sync` in a new one. Dropping MLflow's cached engines stands in for that here.
        forget_mlflow_connections()
    assert_same_weights(profiled, seeded_fit([]))

    assert main(["sync", str(folder)]) == 0  # the store is writable again; the spool knows where it goes
    run = only_run(uri)
    assert run.info.status == "FINISHED"
    assert metric_steps(uri, run.info.run_id, STEP_KEY) == TEN_BATCHES_LOGGED_EVERY_TWO
    assert not pending_batches(folder / "spool" / "rank0")
