"""Running the fault-injection job (`fault_job.py`) and the examples in real processes and reading what they leave
behind (Lightning's launcher re-runs sys.argv, so its DDP never runs inside pytest)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names
from anemoi_profiler.run_files.layout import run_folders

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAULT_JOB = Path(__file__).resolve().parent / "fault_job.py"
JOB_TIMEOUT_S = 180
MAX_STEPS = 20
BATCH_SIZE = 8
WARMUP_STEPS = 2
# Small intervals and a short sampling period, so that 20 steps give several of each.
FAST = [
    f"--max-steps={MAX_STEPS}",
    f"--batch-size={BATCH_SIZE}",
    "log_every_n_steps=4",
    f"throughput.warmup_steps={WARMUP_STEPS}",
    "system.interval_s=1",
    "report.console=false",
]
# Two training windows (batches 4-5 and 8-9) and the preset's validation window.
SMALL_WINDOWS = [
    "profiler.enabled=true",
    "profiler.train.skip_first=2",
    "profiler.train.wait=1",
    "profiler.train.warmup=1",
    "profiler.train.active=2",
    "profiler.train.repeat=2",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_environment() -> dict[str, str]:
    """One thread per process (the ranks share few cores) and no tracking URI inherited from the tests."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def start_job(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args,
        cwd=cwd,
        env={**job_environment(), **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so a hung job can be killed with all its ranks
    )


def finish_job(process: subprocess.Popen[str], deadline: float) -> tuple[int, str]:
    """Exit code and output; a job still running at the deadline is killed and fails the test."""
    try:
        output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"job still running after {JOB_TIMEOUT_S} s; its output ends with:\n{output[-6000:]}")
    return process.returncode, output


def run_jobs(commands: list[list[str]], cwd: Path, extra_env: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """Start the commands together (launchers of one job) and wait for all of them."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    processes = [start_job(command, cwd, extra_env) for command in commands]
    return [finish_job(process, deadline) for process in processes]


def run_ok(command: list[str], cwd: Path) -> str:
    [(returncode, output)] = run_jobs([command], cwd)
    assert returncode == 0, output[-6000:]
    return output


def job_command(*args: str, script: Path = FAULT_JOB) -> list[str]:
    """The job's command line; its flags go before its `key=value` overrides, as argparse needs."""
    flags = [arg for arg in args if arg.startswith("--")]
    return [sys.executable, str(script), *flags, *(arg for arg in args if not arg.startswith("--"))]


def torchrun(launcher_args: list[str], *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, str(FAULT_JOB), *args]


def only_run_folder(output_dir: Path) -> Path:
    folders = run_folders(output_dir)
    assert len(folders) == 1, folders
    return folders[0]


SENDER_GRACE_S = 60.0
"""How long a job's MLflow sender may still be creating its run after the job ended: it outlives the training
process by at most `tracking.close_timeout_s` (30 s), longer on a machine busy with other tests."""


def only_run(tracking_uri: str) -> Any:
    """The store's one run, waiting for it while the job's sender may still be creating it."""
    client = MlflowClient(tracking_uri)
    deadline = time.monotonic() + SENDER_GRACE_S
    while True:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        if runs or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def trace_ranks(run_dir: Path) -> dict[str, list[int]]:
    """`<stage>/window_<k>` -> ranks of its trace files, after checking each names its own rank inside."""
    windows: dict[str, list[int]] = {}
    for path in sorted((run_dir / "traces").glob("*/window_*/rank*.pt.trace.json.gz")):
        rank = int(path.name.removeprefix("rank").split(".")[0])
        with gzip.open(path, "rt") as file:
            assert json.load(file)["distributedInfo"]["rank"] == rank, path
        windows.setdefault(f"{path.parent.parent.name}/{path.parent.name}", []).append(rank)
    return windows


def throughput_summary(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["data"]


def assert_each_interval_sums_the_two_ranks(tracking_uri: str, run_id: str, ranks_per_replica: int = 1) -> None:
    """Each log interval's global batches/s is rank 0's plus rank 1's (over the ranks of a replica, which see the
    same batches), read back as 1000 / each rank's step time: with two ranks `time/train/step_ms_min` and `_max`
    are the ranks' own, logged at the interval's step. An exact identity, whatever the machine's load."""
    client = MlflowClient(tracking_uri)

    def by_step(name: str) -> dict[int, float]:
        history = client.get_metric_history(run_id, name)
        steps = [point.step for point in history]
        return {point.step: point.value for point in history if steps.count(point.step) == 1}

    rates = by_step(names.throughput("train", "batches_per_sec"))
    fastest, slowest = by_step(names.timing("train", "step_ms_min")), by_step(names.timing("train", "step_ms_max"))
    # An interval where one rank counted no steady batch (its own work's step) has min == max: one rank's figure.
    both = [step for step in rates if step in fastest and step in slowest and fastest[step] != slowest[step]]
    assert both, (rates, fastest, slowest)
    for step in both:
        expected = (1000 / fastest[step] + 1000 / slowest[step]) / ranks_per_replica
        assert rates[step] == pytest.approx(expected, rel=1e-9), step
