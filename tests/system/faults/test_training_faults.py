"""The training itself fails or is stopped: in a step, in the dataloader, by Ctrl-C, by a scheduler's SIGTERM.

The user's exception comes through unchanged (type, message, where it was raised), the exit code is the
one the job has without the profiler, and what was measured is flushed: report, metrics, traces, MLflow run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.data import DataLoader, Dataset

from anemoi_profiler import build_callbacks, names
from anemoi_profiler.analysis.preflight import check_window
from anemoi_profiler.callbacks import StepTimingCallback, ThroughputCallback
from anemoi_profiler.cli.main import main
from anemoi_profiler.clock import BatchCounter, StageClock
from anemoi_profiler.reports.run_data import read_history
from anemoi_profiler.tracking.spool import pending_batches
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer
from tests.helpers.steady_steps import steady_interval_ends
from tests.system.faults.fault_helpers import (
    assert_same_weights,
    metric_steps,
    only_run,
    only_run_folder,
    quick_config,
    seeded_fit,
)
from tests.system.faults.fault_servers import ErrorServer, SlowProxy

pytestmark = [pytest.mark.faults, pytest.mark.soak]  # a long suite: make soak (CI)

HERE = Path(__file__).resolve().parent
JOB = HERE / "train_until_signalled.py"


def finished_status(folder: Path) -> str:
    return json.loads((folder / "report.json").read_text())["header"]["status"]


@pytest.fixture
def embedded_store(tmp_path: Path, new_store: Callable[[Path], str]) -> str:
    """The profiler's default store `<output_dir>/mlflow.db`, already migrated."""
    return new_store(tmp_path / "runs" / "mlflow.db")


@pytest.fixture
def sigint_handler() -> Iterator[None]:
    """Lightning ignores SIGINT after a KeyboardInterrupt; give the test process its handler back."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


class MiscountingThroughput(ThroughputCallback):
    """A bug in what the stage clock calls inside Lightning's batch hook, from the fourth batch on."""

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_session_start(trainer, pl_module)
        self.clock.counter = MiscountingCounter(self.clock)


class MiscountingCounter(BatchCounter):
    def __init__(self, clock: StageClock) -> None:
        super().__init__()
        self.clock = clock

    def count(self, batch: Any) -> tuple[int, int]:
        if self.clock.train_batches_seen > 3:
            raise ZeroDivisionError("a bug in counting")
        return super().count(batch)


def test_an_error_in_the_clocks_batch_hooks_stops_the_clock_not_the_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stage clock's batch hooks catch the error, log it once, and the clock stops: it is not called again,
    the other callbacks go on, and no hook is set on a callback's instance."""
    config = quick_config(tmp_path / "runs", "tracking.enabled=false", "system.enabled=false")
    throughput, timing = MiscountingThroughput(config), StepTimingCallback(config)
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        profiled = seeded_fit([throughput, timing])
    assert_same_weights(profiled, seeded_fit([]))
    (message,) = [r.getMessage() for r in caplog.records if "stopped after an error" in r.getMessage()]
    assert "the stage clock stopped after an error in on_train_batch_end" in message
    assert "ZeroDivisionError: a bug in counting" in message
    assert throughput.session.clock_callback is not None and throughput.session.clock_callback.stopped
    assert not [name for name in vars(throughput) if name.startswith("on_")]
    assert throughput.clock.train_batches_seen == 4  # not called again after the error
    assert not timing.disabled
    folder = only_run_folder(tmp_path / "runs")
    assert json.loads((folder / "report.json").read_text())["header"]["status"] == "FINISHED"


def test_exception_in_a_step_flushes_traces_report_metrics_and_marks_the_run_failed(
    tmp_path: Path, embedded_store: str
) -> None:
    config = quick_config(
        tmp_path / "runs",
        "profiler.enabled=true",
        "profiler.train.skip_first=0",
        "profiler.train.wait=0",
        "profiler.train.warmup=1",
        "profiler.train.active=2",
    )
    train, _ = loaders(n_train=16 * 20)
    with pytest.raises(RuntimeError, match=r"^boom from the user's training_step$") as raised:
        trainer(build_callbacks(config)).fit(TinyRegressor(fail_at_step=6), train)
    assert type(raised.value) is RuntimeError
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "training_step"

    folder = only_run_folder(tmp_path / "runs")
    assert finished_status(folder) == "FAILED"
    # every interval before the failure that has a steady step (the profiling window's steps are left out)
    points = read_history(folder)[names.TRAIN_STEP_MS]["step"]
    assert points and points == steady_interval_ends(folder, 2)[: len(points)] and max(points) <= 6
    window = check_window(folder / "traces" / "train" / "window_0")  # complete, readable, ranked
    assert window.ranks == [0] and window.profiler_steps == 2
    assert (folder / "time_report.json").is_file()
    run = only_run(embedded_store)
    assert run.info.status == "FAILED"
    artifacts = {a.path for a in MlflowClient(embedded_store).list_artifacts(run.info.run_id, "profiler")}
    assert {"profiler/report.json", "profiler/metrics.json", "profiler/traces"} <= artifacts
    assert not pending_batches(folder / "spool" / "rank0")


class FailingDataset(Dataset):
    """Sample `fail_at` cannot be read, as with a corrupt file on disk."""

    def __init__(self, size: int, fail_at: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=generator)
        self.fail_at = fail_at

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.fail_at:
            raise ValueError(f"sample {index} is corrupt")
        return self.x[index], self.x[index].sum(dim=0, keepdim=True)


def dataloader_error(callbacks: list[Any], num_workers: int) -> BaseException:
    data = DataLoader(FailingDataset(16 * 12, fail_at=16 * 7 + 3), batch_size=16, num_workers=num_workers)
    with pytest.raises(ValueError, match="sample 115 is corrupt") as raised:
        trainer(callbacks).fit(TinyRegressor(), data)
    return raised.value


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exception_in_the_dataloader_passes_through_unchanged_and_marks_the_run_failed(
    tmp_path: Path, embedded_store: str, num_workers: int
) -> None:
    """With workers, the batches come from processes forked while the profiler's threads run."""
    profiled = dataloader_error(build_callbacks(quick_config(tmp_path / "runs")), num_workers)
    plain = dataloader_error([], num_workers)
    assert type(profiled) is type(plain) and str(profiled) == str(plain)

    folder = only_run_folder(tmp_path / "runs")
    assert finished_status(folder) == "FAILED"
    assert read_history(folder)[names.TRAIN_STEP_MS]["step"] == [2, 4, 6]
    assert only_run(embedded_store).info.status == "FAILED"


def test_keyboard_interrupt_exits_as_without_the_profiler_and_marks_the_run_killed(
    tmp_path: Path, embedded_store: str, sigint_handler: None
) -> None:
    """Lightning turns Ctrl-C into a graceful shutdown and `sys.exit(1)`; the profiler changes neither."""

    class Interrupted(TinyRegressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == 5:
                raise KeyboardInterrupt
            return super().training_step(batch, batch_idx)

    def exit_code(callbacks: list[Any]) -> Any:
        train, _ = loaders(n_train=16 * 20)
        with pytest.raises(SystemExit) as raised:
            trainer(callbacks).fit(Interrupted(), train)
        return raised.value.code

    assert exit_code(build_callbacks(quick_config(tmp_path / "runs"))) == exit_code([]) == 1
    folder = only_run_folder(tmp_path / "runs")
    assert finished_status(folder) == "KILLED"
    assert read_history(folder)[names.TRAIN_STEP_MS]["step"] == [2, 4]
    assert only_run(embedded_store).info.status == "KILLED"


@pytest.mark.slow
def test_sigterm_from_a_scheduler_flushes_marks_the_run_killed_and_keeps_the_exit_code(
    tmp_path: Path, embedded_store: str
) -> None:
    """The same job with and without the profiler gets SIGTERM mid-fit; Lightning stops the fit gracefully."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[2]), os.environ.get("PYTHONPATH", "")])}
    jobs = {}
    for name, flags in (("profiled", ["--profiled"]), ("plain", [])):
        ready, log = tmp_path / f"{name}.ready", (tmp_path / f"{name}.log").open("w")
        command = [sys.executable, str(JOB), str(tmp_path / "runs"), str(ready), *flags]
        jobs[name] = (subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), ready, log)
    for process, ready, _ in jobs.values():
        deadline = time.monotonic() + 180
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
    codes = {name: process.wait(120) for name, (process, _, log) in jobs.items() if not log.close()}
    output = {name: (tmp_path / f"{name}.log").read_text() for name in jobs}

    assert all(ready.exists() for _, ready, _ in jobs.values()), output
    assert codes["profiled"] == codes["plain"], output["profiled"][-3000:]
    for sign in ("fit returned", "Traceback"):
        assert (sign in output["profiled"]) == (sign in output["plain"]), output["profiled"][-3000:]
    folder = only_run_folder(tmp_path / "runs")
    assert finished_status(folder) == "KILLED"
    assert read_history(folder)[names.TRAIN_STEP_MS]["step"][:3] == [2, 4, 6]
    run = only_run(embedded_store)
    assert run.info.status == "KILLED"
    assert names.SUMMARY_TRAIN_SAMPLES_PER_SEC in run.data.metrics
    assert not pending_batches(folder / "spool" / "rank0")


def final_status_spooled(output_dir: Path) -> bool:
    """Whether the profiler has put the run's final status into the spool: it is waiting on MLflow now."""
    for path in output_dir.glob("*/spool/*/batch-*.json"):
        with contextlib.suppress(FileNotFoundError):  # sent and removed meanwhile
            if '"terminate": "KILLED"' in path.read_text():
                return True
    return False


@pytest.mark.slow
def test_sigkill_after_the_grace_period_loses_nothing_that_was_measured(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """SIGTERM, then SIGKILL while the profiler still waits on a tracking server that takes a minute per request
    (as when a scheduler's grace period is shorter than `tracking.close_timeout_s`): `sync` sends it all."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[2]), os.environ.get("PYTHONPATH", "")])}
    ready, log = tmp_path / "job.ready", (tmp_path / "job.log").open("w")
    with ErrorServer(503) as nowhere, SlowProxy(nowhere.uri, delay_s=60.0) as slow:
        command = [
            sys.executable,
            str(JOB),
            str(tmp_path / "runs"),
            str(ready),
            "--profiled",
            f"--tracking-uri={slow.uri}",
        ]
        job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while not ready.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)
        while not final_status_spooled(tmp_path / "runs") and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        job.kill()  # the profiler now waits for the slow server, up to close_timeout_s (30 s)
        job.wait(30)
    log.close()
    assert job.returncode == -signal.SIGKILL, (tmp_path / "job.log").read_text()[-3000:]

    folder = only_run_folder(tmp_path / "runs")
    target = new_store(tmp_path / "later.db")
    assert main(["sync", str(folder), "--tracking-uri", target]) == 0
    run = only_run(target)
    assert run.info.status == "KILLED"
    logged = read_history(folder)[names.TRAIN_STEP_MS]["step"]
    assert metric_steps(target, run.info.run_id, names.TRAIN_STEP_MS) == logged and logged[:3] == [2, 4, 6]
    assert names.SUMMARY_TRAIN_SAMPLES_PER_SEC in run.data.metrics
