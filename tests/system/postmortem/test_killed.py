"""Killed without a chance to speak: SIGKILL (the kernel's OOM killer, Lightning's launcher after a peer died) runs
no Python in the process; the MLflow sender beside rank 0 sends what was spooled, writes the record, and ends the
run KILLED. `anemoi-profiler report` then works on the folder the job left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names
from anemoi_profiler.cli.main import main
from anemoi_profiler.reports.run_data import read_history
from anemoi_profiler.run_files.layout import ENVIRONMENT_FILE
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.spool import write_batch
from anemoi_profiler.tracking.vanished import UNHANDLED_SIGNAL, exit_status
from tests.system.faults.fault_helpers import only_run_folder

REPO = Path(__file__).resolve().parents[3]
FAULT_JOB = REPO / "tests" / "helpers" / "fault_job.py"
KILL_AT_STEP = 25
SINK_THEN_KILL = """
import os, signal, sys, time
from pathlib import Path
from anemoi_profiler.tracking.sink import TrackingSink
sink = TrackingSink(sys.argv[1], "killed", Path(sys.argv[2]) / "spool" / "rank0", flush_interval_s=0.2)
for step in range(1, 26):
    sink.log_metrics({"time/train/step_ms": 10.0 + step, "memory/cpu_rss_mb": 400.0 + step}, step)
sink.flush(60)
os.kill(os.getpid(), signal.SIGKILL)
"""


def the_run(uri: str) -> object | None:
    """The store's one run; None before the sender created it (it may still be importing MLflow)."""
    client = MlflowClient(uri)
    runs = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
    assert len(runs) <= 1, runs
    return runs[0] if runs else None


def wait_until_ended(uri: str, deadline_s: float) -> object:
    """The store's one run once it is no longer RUNNING, or as it is at the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        run = the_run(uri)
        if (run is not None and run.info.status != "RUNNING") or time.monotonic() > deadline:  # type: ignore[attr-defined]
            assert run is not None, "no run in the store"
            return run
        time.sleep(0.5)


def senders_of(folder: Path) -> list[int]:
    """The pids of processes whose command line names `folder` (the sender does: its spool)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder) in entry.joinpath("cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def no_process_left(folder: Path, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while senders_of(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not senders_of(folder)


def test_a_child_killed_by_a_signal_reads_as_that_signal_until_reaped() -> None:
    """What the sender reads of a rank Lightning's launcher started, before the launcher reaps it."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    killed.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (exit_status(killed.pid) is None or exit_status(exited.pid) is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exit_status(killed.pid) == "SIGKILL"
    assert exit_status(exited.pid) == "exit code 3"
    assert killed.wait() == -signal.SIGKILL and exited.wait() == 3
    assert exit_status(killed.pid) is None  # reaped: nothing left to read


@pytest.mark.slow
def test_a_sigkilled_process_gets_its_run_ended_killed_by_the_sender(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """The sink's process logs 25 steps and SIGKILLs itself: no Python of it runs again."""
    uri = new_store(tmp_path / "mlflow.db")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ENVIRONMENT_FILE).write_text("{}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    job = subprocess.run([sys.executable, "-c", SINK_THEN_KILL, uri, str(folder)], env=env, timeout=120)
    assert job.returncode == -signal.SIGKILL

    run = wait_until_ended(uri, 60)
    assert run.info.status == "KILLED"  # type: ignore[attr-defined]
    assert run.data.tags["profiler.postmortem"] == "killed"  # type: ignore[attr-defined]
    assert "vanished after step 25" in run.data.tags["mlflow.note.content"]  # type: ignore[attr-defined]
    history = MlflowClient(uri).get_metric_history(run.info.run_id, names.TRAIN_STEP_MS)  # type: ignore[attr-defined]
    assert sorted(point.step for point in history) == list(range(1, 26))
    record = json.loads((folder / "postmortem" / "killed_rank0.json").read_text())
    assert record["step"] == 25 and record["cause"] == UNHANDLED_SIGNAL
    assert record["memory"][names.CPU_RSS_MB] == 425.0
    assert read_history(folder)[names.TRAIN_STEP_MS]["step"] == list(range(1, 26))  # metrics.json, as sent
    assert no_process_left(folder)


def test_report_on_a_folder_whose_processes_all_died_is_made_from_the_spool(tmp_path: Path) -> None:
    """The sender died too (the scheduler killed the whole job): the spool alone holds what was measured."""
    folder = tmp_path / "run"
    (folder / "spool" / "rank0").mkdir(parents=True)
    (folder / ENVIRONMENT_FILE).write_text("{}")
    batch = Batch(metrics=[[names.TRAIN_STEP_MS, 12.0, 1_000, 5], [names.TRAIN_STEP_MS, 14.0, 2_000, 10]])
    write_batch(batch, folder / "spool" / "rank0" / "batch-00000000000000000001-000000.json")

    assert main(["report", str(folder)]) == 0
    header = json.loads((folder / "report.json").read_text())["header"]
    assert header["status"] == "ended before its report"
    assert header["missing"].startswith("no report was written: its processes ended before it; made from 1 spooled")
    assert "anemoi-profiler sync" in header["missing"]
    assert (folder / "spool" / "rank0" / "batch-00000000000000000001-000000.json").exists()  # left for `sync`


@pytest.mark.slow
def test_a_rank_sigkilled_under_lightnings_launcher_ends_the_run_killed_naming_it(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """Rank 1 SIGKILLs itself at step 25; rank 0 sleeps in that step, so Lightning's launcher (rank 0's own thread,
    every 5 s) SIGKILLs it before gloo tells it of the dead peer: the whole job dies without a word."""
    uri = new_store(tmp_path / "runs" / "mlflow.db")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        *(sys.executable, str(FAULT_JOB), "--devices", "2", "--max-steps", "60", "--step-ms", "20"),
        *("--kill-rank", "1", "--kill-at-step", str(KILL_AT_STEP)),
        *("--slow-rank", "0", "--slow-ms", "20000", "--slow-from-step", str(KILL_AT_STEP)),
        *("--output-dir", str(tmp_path / "runs"), "--tracking-uri", uri),
        *("log_every_n_steps=5", "tracking.flush_interval_s=0.5", "throughput.warmup_steps=0"),
    ]
    job = subprocess.run(command, env=env, timeout=300, capture_output=True, text=True)
    assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]  # killed by the launcher, as without us

    folder = only_run_folder(tmp_path / "runs")
    run = wait_until_ended(uri, 60)
    assert run.info.status == "KILLED"  # type: ignore[attr-defined]
    tags = run.data.tags  # type: ignore[attr-defined]
    assert tags["profiler.postmortem"] == "killed"
    assert "rank 0 (pid" in tags["mlflow.note.content"] and "rank 1 (pid" in tags["mlflow.note.content"]
    steps = [point.step for point in MlflowClient(uri).get_metric_history(run.info.run_id, names.TRAIN_STEP_MS)]  # type: ignore[attr-defined]
    assert steps and max(steps) <= KILL_AT_STEP
    record = json.loads((folder / "postmortem" / "killed_rank0.json").read_text())
    assert [peer["rank"] for peer in record["peers_ended"]] == [1]
    assert record["step"] <= KILL_AT_STEP
    assert no_process_left(folder)

    assert main(["report", str(folder)]) == 0
    report = json.loads((folder / "report.json").read_text())
    assert report["header"]["missing"].startswith(
        f"no report was written: rank 0 was killed after step {record['step']}"
    )
    assert report["sections"]["Diagnosis"]["data"]["verdicts"][0]["id"] == "killed"


def memory_limited_cgroup(name: str, limit_bytes: int) -> Path | None:
    """A child of this process's memory cgroup (v1, or v2 where memory is delegated) limited to `limit_bytes`;
    None where the machine does not allow it (not root, no writable cgroup)."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            folder, limits = Path("/sys/fs/cgroup") / path.lstrip("/") / name, ("memory.max", "memory.swap.max")
        elif "memory" in controllers.split(","):
            limits = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / name
        else:
            continue
        try:
            folder.mkdir(exist_ok=True)
            (folder / limits[0]).write_text(str(limit_bytes))
        except OSError:
            continue
        with contextlib.suppress(OSError):  # no swap accounting: swap may slow the kill, not prevent it
            (folder / limits[1]).write_text(str(limit_bytes) if limits[1].endswith("bytes") else "0")
        return folder
    return None


@pytest.mark.slow
def test_a_rank_killed_by_the_oom_killer_in_a_memory_limited_cgroup_is_named_so(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """The real thing where the machine allows it: rank 1 allocates until the kernel's OOM killer ends it."""
    cgroup = memory_limited_cgroup(f"anemoi-profiler-test-{os.getpid()}", 2500 << 20)
    if cgroup is None:
        pytest.skip("no memory cgroup to limit here (not root, or cgroups not writable)")
    uri = new_store(tmp_path / "runs" / "mlflow.db")
    paths = [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    job_command = [
        *(sys.executable, str(FAULT_JOB), "--devices", "2", "--max-steps", "60", "--step-ms", "20"),
        *("--kill-rank", "1", "--kill-at-step", str(KILL_AT_STEP), "--kill-by-oom"),
        *("--slow-rank", "0", "--slow-ms", "20000", "--slow-from-step", str(KILL_AT_STEP)),
        *("--output-dir", str(tmp_path / "runs"), "--tracking-uri", uri, "log_every_n_steps=5"),
    ]
    enter = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
    try:
        job = subprocess.run(["sh", "-c", enter, "sh", *job_command], env=env, timeout=300, capture_output=True)
        assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
        folder = only_run_folder(tmp_path / "runs")
        run = wait_until_ended(uri, 60)
        assert no_process_left(folder)
    finally:
        deadline = time.monotonic() + 30
        while cgroup.exists() and time.monotonic() < deadline:
            try:
                cgroup.rmdir()
            except OSError:
                time.sleep(0.5)  # its last process is still exiting
    assert run.info.status == "KILLED"  # type: ignore[attr-defined]
    record = json.loads((folder / "postmortem" / "killed_rank0.json").read_text())
    assert record["oom_kills"]["at_end"] > record["oom_kills"]["at_start"]
    assert "rank 1 (pid" in record["summary"]  # ended first, or (reaped within the sender's 0.5 s) gone with it
    assert "the kernel's OOM killer" in run.data.tags["mlflow.note.content"]  # type: ignore[attr-defined]
