"""Short runs: how much longer a short CPU fit and its whole script take with the default callbacks than bare.

A short run (tens to hundreds of steps: comparing code versions, CI, a notebook) pays the profiler's start-up
(the MLflow sender importing MLflow, the first system sample) and its end (report, report.html, the last sends)
in full. Two figures, each the default callbacks (`build_callbacks(ProfilerConfig.load(None, ...))`, a sqlite
store) against bare, with bare against another bare run as the control, in an order rotated per repetition;
medians over repetitions:

- `fit()`: its wall time in this process, the callbacks built just before the Trainer (target: <= 2 s more);
- a script that fits and exits: a fresh interpreter's wall time, imports included (target: <= 3 s more).

After the timings one profiled run is read back from MLflow: every metric of its metrics.json there, its
status FINISHED, no spool left behind.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from configurations import missing
from models import SPECS, make_loader, make_model, make_trainer, samples_in

STEPS = 160
KINDS = ("bare", "ours", "bare (control)")
SCRIPT = Path(__file__).with_name("short_run_script.py")


def profiled_callbacks(work_dir: Path, store: str) -> list[Any]:
    from anemoi_profiler import ProfilerConfig, build_callbacks

    config = ProfilerConfig.load(None, [f"output_dir={work_dir / 'runs'}", f"tracking.uri={store}"])
    return build_callbacks(config, batch_size_fn=samples_in)


def short_fit(spec_name: str, device: str, kind: str, work_dir: Path, store: str) -> dict[str, Any]:
    """One fit of `STEPS` steps; for the profiled kind, the session's end breakdown and where its MLflow run went."""
    spec = SPECS[spec_name]
    model, loader = make_model(spec, device), make_loader(spec, STEPS)
    ours = profiled_callbacks(work_dir, store) if kind == "ours" else []
    trainer = make_trainer(spec, device, STEPS, ours)
    with (work_dir / "fit.log").open("a") as log, contextlib.redirect_stdout(log):
        started = time.perf_counter()
        trainer.fit(model, loader)
        fit_s = time.perf_counter() - started
    row: dict[str, Any] = {"kind": kind, "fit_s": fit_s}
    if ours:
        from anemoi_profiler import wait_for_mlflow

        # A fit that ended before its sender was up leaves the delivery to the background: wait for it here,
        # outside the timed fit and before the next fit starts, so that no later fit shares the CPU with it.
        started = time.perf_counter()
        row["delivered"] = wait_for_mlflow(timeout_s=120.0)
        row["delivery_after_fit_s"] = time.perf_counter() - started
        session = ours[0].session
        row["end_s"] = dict(session.end_seconds)
        row["run_dir"] = str(session.run_dir)
        row["run_id"] = session.sink.run_id if session.sink is not None else None
        row["spool_left"] = bool(session.run_dir and (session.run_dir / "spool").exists())
    return row


def rotated(repetition: int) -> tuple[str, ...]:
    shift = repetition % len(KINDS)
    return KINDS[shift:] + KINDS[:shift]


def fit_set(spec: str, device: str, repetitions: int, work_dir: Path, store: str) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for repetition in range(repetitions):
        for kind in rotated(repetition):
            rows[kind].append(short_fit(spec, device, kind, work_dir, store))
    median = {kind: statistics.median(row["fit_s"] for row in kind_rows) for kind, kind_rows in rows.items()}
    ends = [row["end_s"] for row in rows["ours"]]
    return {
        "bare_s": median["bare"],
        "ours_s": median["ours"],
        "extra_s": median["ours"] - median["bare"],
        "control_s": median["bare (control)"] - median["bare"],
        "end_s": {step: statistics.median(end[step] for end in ends) for step in ends[0]},
        "delivery_after_fit_s": statistics.median(row["delivery_after_fit_s"] for row in rows["ours"]),
        "runs_s": {kind: [row["fit_s"] for row in kind_rows] for kind, kind_rows in rows.items()},
        "last_profiled": rows["ours"][-1],
    }


def script_set(spec: str, device: str, repetitions: int, work_dir: Path, store: str) -> dict[str, Any]:
    walls: dict[str, list[float]] = {kind: [] for kind in KINDS}
    fits: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for repetition in range(repetitions):
        for kind in rotated(repetition):
            command = [sys.executable, str(SCRIPT), "--spec", spec, "--device", device, "--steps", str(STEPS)]
            command += ["--work-dir", str(work_dir), *(["--profiled", "--store", store] if kind == "ours" else [])]
            started = time.perf_counter()
            completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
            walls[kind].append(time.perf_counter() - started)
            if completed.returncode != 0:
                raise RuntimeError(f"{kind} script exited {completed.returncode}: {completed.stderr[-2000:]}")
            (timing,) = [line for line in completed.stdout.splitlines() if line.startswith('{"fit_s"')]
            fits[kind].append(json.loads(timing)["fit_s"])
    median = {kind: statistics.median(values) for kind, values in walls.items()}
    fit_median = {kind: statistics.median(values) for kind, values in fits.items()}
    return {
        "bare_s": median["bare"],
        "ours_s": median["ours"],
        "extra_s": median["ours"] - median["bare"],
        "control_s": median["bare (control)"] - median["bare"],
        "fit_extra_s": fit_median["ours"] - fit_median["bare"],
        "runs_s": walls,
        "fit_runs_s": fits,
    }


def delivered(row: dict[str, Any], store: str) -> dict[str, Any]:
    """The profiled run as MLflow has it: every metric of its metrics.json, FINISHED (read after all timings,
    so MLflow is never imported into the process while it times fits)."""
    from mlflow.tracking import MlflowClient

    keys = set(json.loads((Path(row["run_dir"]) / "metrics.json").read_text()))
    run = MlflowClient(store).get_run(row["run_id"])
    absent = sorted(key for key in keys if key not in run.data.metrics)
    return {"status": run.info.status, "metrics": len(keys), "absent": absent, "spool_left": row["spool_left"]}


def short_run(work_dir: Path, spec: str, device: str, repetitions: int, script_repetitions: int) -> dict[str, Any]:
    absent = missing("anemoi_profiler", "omegaconf", "torchinfo", "mlflow")
    if absent:
        return {"note": f"skipped: cannot import {', '.join(absent)}"}
    folder = work_dir / "short_run"
    folder.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{folder / 'mlflow.db'}"
    short_fit(spec, device, "ours", folder, store)  # warm store: the schema is created once, as on any later run
    fit = fit_set(spec, device, repetitions, folder, store)
    last = fit.pop("last_profiled")
    return {
        "spec": SPECS[spec].describe(),
        "steps": STEPS,
        "repetitions": repetitions,
        "fit": fit,
        "script": script_set(spec, device, script_repetitions, folder, store),
        "delivered": delivered(last, store),
    }
