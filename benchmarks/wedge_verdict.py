"""What faulthandler's timer costs, and how soon a wedge with the interpreter lock held is told to MLflow.

    python benchmarks/wedge_verdict.py [--stall-after-s 3] [--wedged-s 25] [--rounds 3] [--out results.json]

- `rearm`: one re-arm of the timer as the stall watchdog makes it (`NativeStacks.arm`: the header rewritten in
  place, `faulthandler.dump_traceback_later`), median of 2000; the watchdog makes one per wake (1 s) that sees
  progress, on its own thread, never on the training thread;
- `steps`: a training-like loop (a 256x256 matmul and a Python loop, about 1 ms a step) timed with the watchdog
  and its timer on, and with the watchdog on and its timer off, alternated in blocks: median step time of each;
- `verdict`: the wedged job of the tests (`tests/system/postmortem/wedged_job.py`: a real fit whose step keeps
  the interpreter lock for `--wedged-s` in C code) on a fresh sqlite MLflow store, `postmortem.stall_after_s`
  set; from the job's line just before the wedge to `postmortem/stall_1.json` and to the MLflow run's tag
  `profiler.postmortem=stall`, polled every 0.1 s from this process. Target: `stall_after_s` + 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def rearm_cost(folder: Path, calls: int = 2000) -> dict[str, float]:
    from anemoi_profiler.postmortem.native_stacks import NativeStacks

    native = NativeStacks(folder, 0, 1, threading.get_ident())
    assert native.open()
    times = []
    try:
        for step in range(calls):
            start = time.perf_counter()
            native.arm(1, 60.0, step, step)
            times.append(time.perf_counter() - start)
    finally:
        native.close()
    return {"median_us": statistics.median(times) * 1e6, "p95_us": sorted(times)[int(0.95 * calls)] * 1e6}


def step_times(folder: Path, native: bool, steps: int) -> list[float]:
    import torch

    from anemoi_profiler.postmortem.watchdog import Progress, StallWatchdog

    finished = [0]
    progress = Progress(lambda: finished[0], lambda: finished[0], lambda: [], lambda: False)
    watchdog = StallWatchdog(folder, 0, 1, 60.0, progress, native_stacks=native)
    watchdog.start()
    a = torch.randn(256, 256)
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            (a @ a).sum()
            sum(range(20000))
            finished[0] += 1
            times.append(time.perf_counter() - start)
    finally:
        watchdog.stop()
    return times


def per_step(folder: Path, blocks: int = 6, steps: int = 3000) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"timer on": [], "timer off": []}
    for block in range(blocks):
        for native in (block % 2 == 0, block % 2 == 1):
            samples["timer on" if native else "timer off"] += step_times(folder / f"{block}{native}", native, steps)
    medians = {name: statistics.median(times) * 1e6 for name, times in samples.items()}
    return {
        "median_step_us": medians,
        "difference_us": medians["timer on"] - medians["timer off"],
        "steps_each": len(samples["timer on"]),
    }


def verdict(folder: Path, stall_after_s: float, wedged_s: int) -> dict[str, float | None]:
    from mlflow.tracking import MlflowClient

    output_dir = folder / "runs"
    output_dir.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    client.search_experiments()  # the store made and migrated here, before the job's sender opens it
    job = REPO / "tests" / "system" / "postmortem" / "wedged_job.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    command = [sys.executable, str(job), str(output_dir), "6", str(wedged_s)]
    overrides = [f"postmortem.stall_after_s={stall_after_s}", "tracking.flush_interval_s=0.5"]
    process = subprocess.Popen([*command, *overrides], stdout=subprocess.PIPE, text=True, env=env, cwd=folder)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("wedged at step"):
            break
    wedged_at = time.monotonic()
    record_s = tag_s = None
    while time.monotonic() < wedged_at + wedged_s and (record_s is None or tag_s is None):
        if record_s is None and list(output_dir.glob("*/postmortem/stall_1.json")):
            record_s = time.monotonic() - wedged_at
        if tag_s is None:
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
            if any(run.data.tags.get("profiler.postmortem") == "stall" for run in runs):
                tag_s = time.monotonic() - wedged_at
        time.sleep(0.1)
    still_wedged = time.monotonic() < wedged_at + wedged_s
    process.communicate(timeout=300)  # reads its output to the end: the job's prints never meet a closed pipe
    return {"record_s": record_s, "tag_s": tag_s, "still_wedged": still_wedged, "returncode": process.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stall-after-s", type=float, default=3.0)
    parser.add_argument("--wedged-s", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only-verdict", action="store_true", help="skip the re-arm and step measurements")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    results: dict[str, Any] = {"meta": {"commit": commit.stdout.strip(), "stall_after_s": args.stall_after_s}}
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        if not args.only_verdict:
            results["rearm"] = rearm_cost(folder / "rearm")
            print("re-arm:", json.dumps(results["rearm"]), flush=True)
            results["steps"] = per_step(folder / "steps")
            print("steps:", json.dumps(results["steps"]), flush=True)
        results["verdict"] = []
        for round_ in range(args.rounds):
            found = verdict(folder / f"verdict{round_}", args.stall_after_s, args.wedged_s)
            print("verdict:", json.dumps(found), flush=True)
            results["verdict"].append(found)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
