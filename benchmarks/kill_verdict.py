"""Time to verdict after a kill: from a rank's SIGKILL to the MLflow run being KILLED (target: 30 s).

The job is the fault-injection DDP job (tests/helpers/fault_job.py) on CPU under Lightning's own launcher: rank 1
SIGKILLs itself at step 25 (as the kernel's OOM killer does), rank 0 sleeps in that step, so that the launcher
(rank 0's thread, every 5 s) SIGKILLs rank 0 as well before gloo tells it of the dead peer: nothing of the job runs
Python again. The MLflow sender beside rank 0 then ends the run. Per repetition, three figures: from rank 1's kill
to rank 0's end (the launcher's part), from rank 0's end to the run KILLED in the sqlite store (the sender's part,
its MLflow import included when the job was short), and their sum. The store is polled every 0.1 s.

    python benchmarks/kill_verdict.py --repetitions 3 --out kill_verdict.json
    python benchmarks/kill_verdict.py --repetitions 3 --kill-at-step 500    # the sender up long before the kill
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "helpers" / "fault_job.py"
POLL_S = 0.1


def run_status(db: Path) -> str | None:
    """The run's status read with sqlite3 (MLflow's client would migrate the store beside the sender)."""
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=5)) as connection:
            row = connection.execute("SELECT status FROM runs LIMIT 1").fetchone()
    except sqlite3.Error:
        return None  # the sender has not made the store yet
    return row[0] if row else None


def one_kill(work_dir: Path, kill_at_step: int) -> dict[str, Any]:
    store, mark = f"sqlite:///{work_dir / 'mlflow.db'}", work_dir / "killed_at"
    command = [
        *(sys.executable, str(JOB), "--devices", "2", "--max-steps", str(kill_at_step + 40), "--step-ms", "20"),
        *("--kill-rank", "1", "--kill-at-step", str(kill_at_step), "--kill-mark", str(mark)),
        *("--slow-rank", "0", "--slow-ms", "20000", "--slow-from-step", str(kill_at_step)),
        *("--output-dir", str(work_dir / "runs"), "--tracking-uri", store),
        *("log_every_n_steps=5", "tracking.flush_interval_s=0.5"),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    job = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    job_ended = time.time()
    while run_status(work_dir / "mlflow.db") in ("RUNNING", None) and time.time() - job_ended < 120:
        time.sleep(POLL_S)
    ended = time.time()
    killed_at = float(mark.read_text())
    return {
        "job_exit": job.returncode,
        "status": run_status(work_dir / "mlflow.db"),
        "kill_to_job_end_s": round(job_ended - killed_at, 2),
        "job_end_to_killed_s": round(ended - job_ended, 2),
        "kill_to_killed_s": round(ended - killed_at, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", help="JSON file for the results")
    parser.add_argument("--kill-at-step", type=int, default=25, help="later: the sender has long been up (20 ms steps)")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repetitions):
        with tempfile.TemporaryDirectory() as work_dir:
            rows.append(one_kill(Path(work_dir), args.kill_at_step))
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "repetitions": rows,
        "median_kill_to_killed_s": statistics.median(row["kill_to_killed_s"] for row in rows),
        "max_kill_to_killed_s": max(row["kill_to_killed_s"] for row in rows),
        "target_s": 30.0,
        "kill_at_step": args.kill_at_step,
    }
    print(json.dumps({key: value for key, value in result.items() if key != "repetitions"}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
