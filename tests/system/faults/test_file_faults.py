"""Files: an output folder that cannot be written, a disk that fills up during a trace export, and two jobs
that start in the same second in the same output folder."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from anemoi_profiler import build_callbacks, names, wait_for_mlflow
from anemoi_profiler.reports.run_data import read_history
from anemoi_profiler.run_files.layout import RUN_INFO_FILE as RUN_FILE
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.tracking.mlflow_target import MlflowTarget
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.sink import TrackingSink
from tests.system.faults.fault_helpers import (
    assert_same_weights,
    metric_steps,
    only_run,
    quick_config,
    read_only_folder,
    seeded_fit,
)

pytestmark = [pytest.mark.faults, pytest.mark.soak]  # a long suite: make soak (CI)

HERE = Path(__file__).resolve().parent


def profiler_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "anemoi" in r.name]


@pytest.mark.parametrize("obstacle", ["a file in the way", "a read-only folder"])
def test_unwritable_output_folder_turns_the_profiler_off_with_one_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, obstacle: str
) -> None:
    if obstacle == "a file in the way":
        (tmp_path / "shared").write_text("a file where the output folder should be")
        output_dir = tmp_path / "shared" / "runs"
        blocked: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    else:
        output_dir = tmp_path / "readonly"
        output_dir.mkdir()
        blocked = read_only_folder(output_dir)
    with blocked, caplog.at_level(logging.WARNING):
        profiled = seeded_fit(build_callbacks(quick_config(output_dir)))
    assert_same_weights(profiled, seeded_fit([]))
    (message,) = profiler_warnings(caplog)
    assert f"cannot write a run folder below {output_dir}" in message
    assert "the profiler is off for this run, training goes on" in message


class FillTheDisk(pl.Callback):
    """Before the profiling window ends, write a file until the disk (or the file-size limit) says no."""

    def __init__(self, folder: Path, at_step: int) -> None:
        self.folder, self.at_step = folder, at_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.at_step:
            return
        with contextlib.suppress(OSError), (self.folder / "filler.bin").open("wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()


@contextlib.contextmanager
def small_disk(folder: Path, how: str) -> Iterator[None]:
    """`folder` on a 1 MB tmpfs (needs root), or every file of this process limited to 64 kB (RLIMIT_FSIZE)."""
    folder.mkdir()
    if how == "tmpfs":
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        try:
            yield
        finally:
            subprocess.run(["umount", "--lazy", str(folder)], capture_output=True, check=False)
        return
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize("how", ["tmpfs", "file size limit"])
def test_disk_full_during_a_trace_export_lets_the_training_finish(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, new_store: Callable[[Path], str], how: str
) -> None:
    """The trace window ends on a full disk. With a tmpfs, MLflow lives on another disk and still gets every
    metric (the spool cannot be written, so they are sent from memory); under a file-size limit the MLflow
    store could not grow either, so tracking is off there."""
    disk = tmp_path / "disk"
    store = new_store(tmp_path / "store" / "mlflow.db")
    tracking = [f"tracking.uri={store}"] if how == "tmpfs" else ["tracking.enabled=false"]
    config = quick_config(
        disk,
        *tracking,
        "profiler.enabled=true",
        "profiler.train.skip_first=4",
        "profiler.train.wait=0",
        "profiler.train.warmup=1",
        "profiler.train.active=2",
        "system.enabled=false",
    )
    with small_disk(disk, how), caplog.at_level(logging.WARNING):
        profiled = seeded_fit([*build_callbacks(config), FillTheDisk(disk, at_step=5)])
        wait_for_mlflow()  # while the small disk, and the spool on it, is there
        (folder,) = run_folders(disk)
        assert not list((folder / "traces").rglob("*.pt.trace.json.gz")), "a trace was written to a full disk"
    assert_same_weights(profiled, seeded_fit([]))
    warnings = "\n".join(profiler_warnings(caplog))
    assert "could not save the train profiling window" in warnings
    if how == "tmpfs":
        assert "cannot write the spool" in warnings and "they are lost" not in warnings
        run = only_run(store)
        assert run.info.status == "FINISHED"
        # every interval with a steady step: the profiling window's (steps 5-7, and 8 that holds its end) have none
        assert metric_steps(store, run.info.run_id, names.TRAIN_STEP_MS) == [2, 4, 10]


def test_an_unwritable_spool_sends_from_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, new_store: Callable[[Path], str]
) -> None:
    """The write-ahead spool is refused (disk full, read-only): metrics still reach a reachable MLflow."""
    store = new_store(tmp_path / "store" / "mlflow.db")
    spool = tmp_path / "run" / "spool" / "rank0"
    sink = TrackingSink(store, "e", spool, flush_interval_s=0.1)
    assert sink.flush(timeout_s=30) and sink.run_id  # the run exists before the spool is refused
    with read_only_folder(spool), caplog.at_level(logging.WARNING):
        for step in range(1, 101):
            sink.log_metrics({"loss": float(step)}, step)
        assert sink.close("FINISHED", timeout_s=30)
    assert sum("cannot write the spool" in r.getMessage() for r in caplog.records) == 1
    assert "they are lost" not in caplog.text
    run = only_run(store, "e")
    assert run.info.status == "FINISHED"
    assert metric_steps(store, run.info.run_id, "loss") == list(range(1, 101))


def test_two_jobs_creating_the_same_experiment_at_once_both_get_their_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, new_store: Callable[[Path], str]
) -> None:
    """The other job creates the experiment between this job's look-up and its own create."""
    from mlflow.tracking import MlflowClient

    store = new_store(tmp_path / "mlflow.db")
    other_job, look_up = MlflowClient(store), MlflowClient.get_experiment_by_name
    raced: list[str] = []

    def look_up_then_lose_the_race(client: MlflowClient, name: str) -> Any:
        found = look_up(client, name)
        if not raced:
            raced.append(name)
            other_job.create_experiment(name)
        return found

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", look_up_then_lose_the_race)
    # What the sink's sender process runs, run here in-process so that the race can be staged.
    spool = tmp_path / "spool"
    spool.mkdir()
    run_file = {"tracking_uri": store, "experiment": "shared", "run_id": None, "run_name": "r", "tags": {}}
    (spool / RUN_FILE).write_text(json.dumps(run_file))
    target = MlflowTarget(spool, store)
    with caplog.at_level(logging.WARNING):
        target.send(Batch(metrics=[["loss", 1.0, 0, 1]], terminate="FINISHED"))
    assert raced and not caplog.text
    assert metric_steps(store, only_run(store, "shared").info.run_id, "loss") == [1]


def test_a_run_created_but_not_answered_is_found_not_made_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_store: Callable[[Path], str]
) -> None:
    """The server makes the run, then goes away before it answers: the retry finds that run by its key."""
    from mlflow.tracking import MlflowClient

    store = new_store(tmp_path / "mlflow.db")
    create = MlflowClient.create_run
    lost: list[str] = []

    def create_then_lose_the_answer(client: MlflowClient, *args: Any, **kwargs: Any) -> Any:
        run = create(client, *args, **kwargs)
        if not lost:
            lost.append(run.info.run_id)
            raise ConnectionError("Remote end closed connection without response")
        return run

    monkeypatch.setattr(MlflowClient, "create_run", create_then_lose_the_answer)
    spool = tmp_path / "spool"
    spool.mkdir()
    run_file = {"tracking_uri": store, "experiment": "e", "run_id": None, "run_name": "r", "tags": {}}
    (spool / RUN_FILE).write_text(json.dumps(run_file))
    with pytest.raises(ConnectionError):
        MlflowTarget(spool, store).send(Batch(metrics=[["loss", 1.0, 0, 1]]))
    # The sender retries with what run.json holds (a later `sync` does the same).
    MlflowTarget(spool, store).send(Batch(metrics=[["loss", 1.0, 0, 1]], terminate="FINISHED"))
    run = only_run(store, "e")
    assert [run.info.run_id] == lost
    assert run.info.status == "FINISHED"
    assert metric_steps(store, run.info.run_id, "loss") == [1]


@pytest.mark.slow
def test_two_jobs_starting_in_the_same_second_get_two_run_folders(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """Two real processes, same config, same output folder, same second, one shared embedded MLflow store."""
    output_dir, sync_dir = tmp_path / "runs", tmp_path / "sync"
    sync_dir.mkdir()
    store = new_store(output_dir / "mlflow.db")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[2]), os.environ.get("PYTHONPATH", "")])}
    job_logs = {batches: (tmp_path / f"job{batches}.log").open("w") for batches in (6, 10)}
    jobs = {
        batches: subprocess.Popen(
            [sys.executable, str(HERE / "start_together.py"), str(output_dir), str(sync_dir), str(batches)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        for batches, log in job_logs.items()
    }
    for log in job_logs.values():
        log.close()  # each job keeps its own copy
    deadline = time.monotonic() + 180
    while len(list(sync_dir.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    plan = {"stamp": time.strftime("%Y%m%d-%H%M%S"), "start_at": time.time() + 1.0}
    (sync_dir / "go.tmp").write_text(json.dumps(plan))
    (sync_dir / "go.tmp").replace(sync_dir / "go")
    results = {batches: job.communicate(timeout=180)[0] for batches, job in jobs.items()}
    logs = {batches: (tmp_path / f"job{batches}.log").read_text() for batches in jobs}
    assert all(job.returncode == 0 for job in jobs.values()), logs
    assert not any("anemoi-profiler" in log for log in logs.values()), logs  # not a single warning
    # each job's JSON line; the lines with its MLflow run's link may follow it (printed once delivered)
    said = {
        batches: json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        for batches, out in results.items()
    }

    folders = run_folders(output_dir)
    assert len(folders) == 2 and folders[0].name.startswith(plan["stamp"]), folders
    assert {said[6]["run_folder"], said[10]["run_folder"]} == {f.name for f in folders}
    for batches, job_said in said.items():
        folder = output_dir / job_said["run_folder"]
        report = json.loads((folder / "report.json").read_text())
        assert report["header"]["run folder"] == str(folder)
        assert report["header"]["steps"] == batches == job_said["steps"]
        assert read_history(folder)[names.TRAIN_STEP_MS]["step"][-1] == batches
        assert {"config.yaml", "environment.json", "report.txt"} <= {p.name for p in folder.iterdir()}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert sorted(run.info.run_name for run in runs) == sorted(f.name for f in folders)  # folders: by start
    assert all(run.info.status == "FINISHED" for run in runs)
    for run in runs:
        expected = 6 if run.info.run_name == said[6]["run_folder"] else 10
        assert metric_steps(store, run.info.run_id, names.TRAIN_STEP_MS)[-1] == expected
