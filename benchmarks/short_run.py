"""Short runs: what the default callbacks cost a 160-step fit in its first seconds and at its end.

A short run (tens to hundreds of steps, to compare code versions, in CI or a notebook) is measured while the
profiler's start-up work runs beside it (the MLflow sender importing MLflow, the first system sample) and ends
with the profiler's end work (report, report.html, the last sends). Three figures, each bare against the default
callbacks (`build_callbacks(ProfilerConfig.load(None, ...))`, a warm sqlite store), with a bare run against
another bare run as the control, interleaved in one run in an order rotated per repetition. A bare run beside
another process that imports what the MLflow sender imports at its start, and nothing else (`bare beside
MLflow's import`), shows what that import alone costs the steps it overlaps. The profiled fits held to the
targets are each the first run of a process: the sender kept from the last one is ended first, so a new one
imports MLflow beside the fit. A later run of a process, which takes the kept sender (`ours (kept sender)`), is
measured beside them:

- early steps: the median step time over batches 40-160 of each fit, as a ratio to the bare fit of the same
  repetition; the section's figure is the median ratio. A set whose control strays by more than 1 % is
  repeated, not counted (the attempts are kept in the results).
- early steps by parts: whole fits on a shared VM differ by several percent (the host's speed drifts within
  seconds), more than the 1 % to resolve. Every fit also carries `step_parts.StepParts`, which reads, over the
  same batches and within the fit, the training thread's time in callback hooks as Lightning calls them, in the
  trainer's profiler calls, and waiting for a core, as a share of the fit's own median step; what a kind adds
  is its median share less the bare fits' (`by_parts_pct`; bare (control) is this figure's noise floor). It
  does not see work on the other core that slows this one through shared caches or memory bandwidth: that is
  what `bare beside MLflow's import` measures, by whole fits.
- `fit()`: its wall time, the callbacks built just before the Trainer (after the model and the data, so
  the sender's start has the least head start a script can give it).
- a script that fits and exits: a fresh interpreter's wall time, imports included, from start to exit.
  Beside it, a script that starts the profiler's MLflow client first thing (`anemoi_profiler.prestart_tracking()`
  before it imports torch: `ours (sender started first)`), and each script's own `fit()`. The same four
  scripts on the early-steps model (`FRESH_SCRIPT_REPETITIONS` each) give a fresh script's early steps.

Each in-process figure is taken on two models: a "5 ms" step (4-9 ms on the VMs measured, 18-22 ms on one
four times slower), where the hooks' steady cost per batch (tens of microseconds: Lightning dispatching two
hooks and our bodies, see the always-on section) is a fraction of 1 %, so that the early-steps figure shows
what the start-up adds; and a 1 ms step, whose 0.2 s fit ends long before the MLflow sender is ready, the
hardest case for the end. The script uses the 1 ms step.

All of these fits run on one torch thread, which leaves the sender a core of its own. A last set runs the
early-steps model's first runs on every core, as torch does by default (no bare-vs-bare limit: it is there to
show stalls, whole batches lost to the sender, by the longest step and `fit()`).

A first run whose script builds the callbacks before its model and data (`ours (callbacks first)`;
anemoi-training builds its model and graph after the Trainer and its callbacks) gives the sender that setup as
a head start: a torch loop on the training's thread stands in for `SETUP_S` seconds of it. Every fit reads the
CPU its child processes (the MLflow sender, or the importing process beside a bare fit) used over the
early-steps window, from `/proc`: what ran beside the steps, without the noise of step times.

The profiled runs' end is broken down by the session's own record of its end (`ProfilerSession.end_seconds`;
of closing the sink, the part that waited for the sender's start-up: `TrackingSink.end_waited_for_startup_s`),
and after the last repetition one profiled run is read back from MLflow: every metric of its metrics.json
there, its status FINISHED, no spool left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from configurations import missing
from measure import children_cpu_s
from models import SPECS, make_loader, make_model, make_trainer, samples_in
from step_parts import StepParts, added_pct, share_pct

STEPS = 160
EARLY = (40, 160)
"""Batches (1-based, inclusive of the end) whose step times are compared."""
CONTROL_LIMIT_PCT = 1.0
IMPORT_BESIDE = "bare beside MLflow's import"
"""A bare fit while another process imports what the MLflow sender imports at its start, as it does (same
modules, same priority), and nothing else: what that import alone costs the steps it overlaps."""
IMPORT_CODE = (
    "from anemoi_profiler.tracking import sender, startup\n"
    "do_import = lambda: sender._import_mlflow('mlflow.store.tracking.sqlalchemy_store')\n"
    "startup.import_in_idle_time(do_import) if startup.imports_in_idle_time() else do_import()"
)
CALLBACKS_FIRST = "ours (callbacks first)"
PRESTARTED = "ours (sender started first)"
"""A script that calls `anemoi_profiler.prestart_tracking()` before it imports torch (the README's advice for
short runs); its callbacks are made just before the Trainer, as in `ours`."""
SETUP_S = 2.0
"""The script's own setup between the callbacks and the Trainer for `CALLBACKS_FIRST` (building a model and its
data takes seconds in a real job)."""
KINDS = ("bare", "ours", "ours (kept sender)", "bare (control)", IMPORT_BESIDE, CALLBACKS_FIRST)
PROFILED = ("ours", "ours (kept sender)", CALLBACKS_FIRST)
FIRST_RUNS = ("ours", CALLBACKS_FIRST)
SCRIPT = Path(__file__).with_name("short_run_script.py")
FRESH_SCRIPT_REPETITIONS = 9
"""Scripts of each kind on the early-steps model (the fewest the early-steps rule allows): a fresh interpreter's
first run, where the sender's whole start-up runs beside the steps."""


class BatchEnds(pl.Callback):
    """The time each training batch ended; a step is the time between two ends (on a GPU, after the device
    finished it, in bare and profiled fits alike). At the early window's two ends, the children's CPU time."""

    def __init__(self, sync_cuda: bool) -> None:
        self.ends: list[float] = []
        self.sync_cuda = sync_cuda
        self.children_cpu_s: list[float | None] = []

    def on_train_batch_end(self, *args: Any) -> None:
        if self.sync_cuda:
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        if len(self.ends) in EARLY:  # one step of the window's 120 pays the reading (about 1 ms): not its median
            self.children_cpu_s.append(children_cpu_s())

    def children_cpu_in_window_s(self) -> float | None:
        readings = [seconds for seconds in self.children_cpu_s if seconds is not None]
        return readings[1] - readings[0] if len(readings) == 2 else None


def start_import_beside() -> subprocess.Popen[bytes]:
    """The sender's start-up import alone, in a process at the sender's priority from its start, in idle time where
    the sender imports in idle time: as it is."""
    from anemoi_profiler.tracking.sender import NICENESS

    return subprocess.Popen(["nice", "-n", str(NICENESS), sys.executable, "-c", IMPORT_CODE])


def stand_in_setup(seconds: float) -> None:
    """Keep the training's thread busy with torch for `seconds`, as building a model and its data would."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        torch.randn(256, 256).matmul(torch.randn(256, 256))


def early_step_ms(ends: list[float]) -> float:
    first, last = EARLY
    steps = [b - a for a, b in zip(ends[first - 2 : last - 1], ends[first - 1 : last], strict=True)]
    return statistics.median(steps) * 1000


def profiled_callbacks(work_dir: Path, store: str) -> list[Any]:
    from anemoi_profiler import ProfilerConfig, build_callbacks

    config = ProfilerConfig.load(None, [f"output_dir={work_dir / 'runs'}", f"tracking.uri={store}"])
    return build_callbacks(config, batch_size_fn=samples_in)


def short_fit(spec_name: str, device: str, kind: str, work_dir: Path, store: str) -> dict[str, Any]:
    """One 160-step fit; for the profiled kinds, the session's end breakdown and where its MLflow run went. The
    callbacks are made after the model and the data, just before the Trainer, but for `CALLBACKS_FIRST`."""
    spec = SPECS[spec_name]
    if kind in FIRST_RUNS:
        from anemoi_profiler.tracking import sender

        sender.end_kept()  # the first run of a process: its sender starts with the callbacks
    callbacks_first = kind == CALLBACKS_FIRST
    ours = profiled_callbacks(work_dir, store) if callbacks_first else []
    if callbacks_first:
        stand_in_setup(SETUP_S)
    model, loader = make_model(spec, device), make_loader(spec, STEPS)
    clock = BatchEnds(sync_cuda=device == "cuda")
    if kind in PROFILED and not callbacks_first:
        ours = profiled_callbacks(work_dir, store)
    parts = StepParts(*EARLY)
    trainer = make_trainer(spec, device, STEPS, [*ours, clock, parts])
    importing = start_import_beside() if kind == IMPORT_BESIDE else None
    try:
        with (work_dir / "fit.log").open("a") as log, contextlib.redirect_stdout(log):
            started = time.perf_counter()
            trainer.fit(model, loader)
            fit_s = time.perf_counter() - started
    finally:
        if importing is not None:
            importing.wait(120)
    steps = [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)]
    row: dict[str, Any] = {
        "kind": kind,
        "early_step_ms": early_step_ms(clock.ends),
        "longest_step_ms": max(steps) * 1000,
        "fit_s": fit_s,
        "children_cpu_in_window_s": clock.children_cpu_in_window_s(),
        "parts_us": (per_batch := parts.per_batch_us()),
        "parts_pct": share_pct(per_batch, early_step_ms(clock.ends)) if per_batch else None,
    }
    if ours:
        session = ours[0].session
        row["end_s"] = {}
        for step, seconds in session.end_seconds.items():
            row["end_s"][step] = seconds
            if step == "close the MLflow sink":  # the part of it that waited for the sender to be ready
                row["end_s"]["of which the sender's start-up"] = session.sink.end_waited_for_startup_s
        row["run_dir"] = str(session.run_dir)
        row["run_id"] = session.sink.run_id if session.sink is not None else None
        row["spool_left"] = bool(session.run_dir and (session.run_dir / "spool").exists())
    return row


def _rotated(repetition: int, kinds: tuple[str, ...] = KINDS) -> tuple[str, ...]:
    shift = repetition % len(kinds)
    return kinds[shift:] + kinds[:shift]


def _fit_set(spec: str, device: str, repetitions: int, work_dir: Path, store: str) -> dict[str, Any]:
    rows = [
        short_fit(spec, device, kind, work_dir, store)
        for repetition in range(repetitions)
        for kind in _rotated(repetition)
    ]
    by_kind = {kind: [row for row in rows if row["kind"] == kind] for kind in KINDS}
    bare, ours, kept, control, importing, first = (by_kind[kind] for kind in KINDS)

    def ratios_to_bare(rows: list[dict[str, Any]]) -> list[float]:
        return [row["early_step_ms"] / b["early_step_ms"] for row, b in zip(rows, bare, strict=True)]

    ratios, kept_ratios, controls, import_ratios, first_ratios = (
        ratios_to_bare(rows) for rows in (ours, kept, control, importing, first)
    )
    median = {kind: statistics.median(row["fit_s"] for row in by_kind[kind]) for kind in KINDS}
    ends = [row["end_s"] for row in ours]
    beside = {kind: [row["children_cpu_in_window_s"] for row in by_kind[kind]] for kind in KINDS}
    return {
        "early_steps": {
            "bare_ms": statistics.median(row["early_step_ms"] for row in bare),
            "ours_ms": statistics.median(row["early_step_ms"] for row in ours),
            "overhead_pct": (statistics.median(ratios) - 1) * 100,
            "control_pct": (statistics.median(controls) - 1) * 100,
            "import_beside_pct": (statistics.median(import_ratios) - 1) * 100,
            "ratios": ratios,
            "control_ratios": controls,
            "import_beside_ratios": import_ratios,
            "by_parts_pct": {kind: added_pct(by_kind[kind], bare) for kind in KINDS if kind != "bare"},
        },
        "fit": {
            "bare_s": median["bare"],
            "ours_s": median["ours"],
            "extra_s": median["ours"] - median["bare"],
            "control_s": median["bare (control)"] - median["bare"],
            "ours_runs_s": [row["fit_s"] for row in ours],
        },
        "kept_sender": {
            "early_ms": statistics.median(row["early_step_ms"] for row in kept),
            "early_overhead_pct": (statistics.median(kept_ratios) - 1) * 100,
            "early_ratios": kept_ratios,
            "fit_s": median["ours (kept sender)"],
            "fit_extra_s": median["ours (kept sender)"] - median["bare"],
            "end_breakdown_s": {
                step: statistics.median(row["end_s"].get(step, 0.0) for row in kept) for step in kept[0]["end_s"]
            },
        },
        "callbacks_first": {
            "setup_s": SETUP_S,
            "early_ms": statistics.median(row["early_step_ms"] for row in first),
            "early_overhead_pct": (statistics.median(first_ratios) - 1) * 100,
            "early_ratios": first_ratios,
            "fit_s": median[CALLBACKS_FIRST],
            "fit_extra_s": median[CALLBACKS_FIRST] - median["bare"],
            "end_breakdown_s": {
                step: statistics.median(row["end_s"].get(step, 0.0) for row in first) for step in first[0]["end_s"]
            },
        },
        "children_cpu_in_window_s": {
            kind: statistics.median(values) if None not in values else None for kind, values in beside.items()
        },
        "end_breakdown_s": {step: statistics.median(end.get(step, 0.0) for end in ends) for step in ends[0]},
        "spool_left": sum(row["spool_left"] for row in ours),
        "last_profiled": ours[-1],
    }


def _script_set(spec: str, device: str, repetitions: int, work_dir: Path, store: str) -> dict[str, Any]:
    kinds = ("bare", "ours", PRESTARTED, "bare (control)")  # each script is a process of its own: its first run
    walls: dict[str, list[float]] = {kind: [] for kind in kinds}
    fits: dict[str, list[float]] = {kind: [] for kind in kinds}
    early: dict[str, list[float | None]] = {kind: [] for kind in kinds}
    for repetition in range(repetitions):
        for kind in _rotated(repetition, kinds):
            command = [sys.executable, str(SCRIPT), "--spec", spec, "--device", device, "--steps", str(STEPS)]
            command += ["--work-dir", str(work_dir)]
            if kind in ("ours", PRESTARTED):
                command += ["--profiled", "--store", store, *(["--prestart"] if kind == PRESTARTED else [])]
            started = time.perf_counter()
            completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
            walls[kind].append(time.perf_counter() - started)
            if completed.returncode != 0:
                raise RuntimeError(f"{kind} script exited {completed.returncode}: {completed.stderr[-2000:]}")
            printed = json.loads(completed.stdout.strip().splitlines()[-1])
            fits[kind].append(printed["fit_s"])
            early[kind].append(printed["early_step_ms"])

    def early_pct(kind: str) -> float | None:
        """The median over repetitions of the early steps' ratio to the same repetition's bare script."""
        pairs = [(ms, bare) for ms, bare in zip(early[kind], early["bare"], strict=True) if ms and bare]
        return (statistics.median(ms / bare for ms, bare in pairs) - 1) * 100 if pairs else None

    median = {kind: statistics.median(values) for kind, values in walls.items()}
    fit_median = {kind: statistics.median(values) for kind, values in fits.items()}
    return {
        "bare_s": median["bare"],
        "ours_s": median["ours"],
        "extra_s": median["ours"] - median["bare"],
        "control_s": median["bare (control)"] - median["bare"],
        "prestarted_extra_s": median[PRESTARTED] - median["bare"],
        "fit_extra_s": fit_median["ours"] - fit_median["bare"],
        "prestarted_fit_extra_s": fit_median[PRESTARTED] - fit_median["bare"],
        "early_pct": {kind: early_pct(kind) for kind in kinds if kind != "bare"},
        "runs_s": walls,
        "fit_runs_s": fits,
        "early_step_ms": early,
    }


def _every_core_set(spec: str, device: str, repetitions: int, work_dir: Path, store: str) -> dict[str, Any]:
    """The first run of a process on a fit that uses every core, as torch does by default: the sender's start-up
    then has no core of its own and takes a share of the training's."""
    kinds = ("bare", "ours", "bare (control)")
    threads, every_core = torch.get_num_threads(), os.cpu_count() or 1
    torch.set_num_threads(every_core)
    try:
        rows = [
            short_fit(spec, device, "bare" if kind == "bare (control)" else kind, work_dir, store) | {"kind": kind}
            for repetition in range(repetitions)
            for kind in _rotated(repetition, kinds)
        ]
    finally:
        torch.set_num_threads(threads)
    by_kind = {kind: [row for row in rows if row["kind"] == kind] for kind in kinds}

    def ratio_pct(kind: str) -> float:
        pairs = zip(by_kind[kind], by_kind["bare"], strict=True)
        ratios = [row["early_step_ms"] / bare["early_step_ms"] for row, bare in pairs]
        return (statistics.median(ratios) - 1) * 100

    def median(kind: str, key: str) -> float:
        return statistics.median(row[key] for row in by_kind[kind])

    return {
        "spec": SPECS[spec].describe(),
        "threads": every_core,
        "repetitions": repetitions,
        "early_overhead_pct": ratio_pct("ours"),
        "early_control_pct": ratio_pct("bare (control)"),
        "fit_extra_s": median("ours", "fit_s") - median("bare", "fit_s"),
        "fit_control_s": median("bare (control)", "fit_s") - median("bare", "fit_s"),
        "longest_step_ms": {kind: median(kind, "longest_step_ms") for kind in kinds},
        "fit_runs_s": {kind: [row["fit_s"] for row in by_kind[kind]] for kind in kinds},
    }


def delivered(row: dict[str, Any], store: str) -> dict[str, Any]:
    """The profiled run as MLflow has it: every metric of its metrics.json, FINISHED (read after all timings,
    so MLflow is never imported into the process while it times fits)."""
    from mlflow.tracking import MlflowClient

    keys = set(json.loads((Path(row["run_dir"]) / "metrics.json").read_text()))
    run = MlflowClient(store).get_run(row["run_id"])
    absent = sorted(key for key in keys if key not in run.data.metrics)
    return {"status": run.info.status, "metrics": len(keys), "absent": absent, "spool_left": row["spool_left"]}


def _counted_set(spec: str, device: str, repetitions: int, folder: Path, store: str, attempts: int) -> dict[str, Any]:
    """In-process sets until one's control is within 1 % (at most `attempts`); the last one, with the tries."""
    tried = []
    for _ in range(attempts):
        tried.append(_fit_set(spec, device, repetitions, folder, store))
        if abs(tried[-1]["early_steps"]["control_pct"]) <= CONTROL_LIMIT_PCT:
            break
    result = tried[-1]
    return {
        "spec": SPECS[spec].describe(),
        "attempts": [attempt["early_steps"]["control_pct"] for attempt in tried],
        "control_within_limit": abs(result["early_steps"]["control_pct"]) <= CONTROL_LIMIT_PCT,
        **result,
    }


def short_run(
    work_dir: Path,
    specs: tuple[str, str],
    device: str,
    repetitions: int,
    script_repetitions: int,
    attempts: int = 3,
) -> dict[str, Any]:
    """The section; `specs` are the (early steps, end) models: the first's early steps and the second's `fit()`
    and script are the figures held to the targets."""
    absent = missing("anemoi_profiler", "omegaconf", "torchinfo", "mlflow")
    if absent:
        return {"note": f"skipped: cannot import {', '.join(absent)}"}
    folder = work_dir / "short_run"
    folder.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{folder / 'mlflow.db'}"
    short_fit(specs[1], device, "ours", folder, store)  # warm store: the schema is created once, as on any later run
    early_spec, end_spec = specs
    sets = {"early": _counted_set(early_spec, device, repetitions, folder, store, attempts)}
    sets["end"] = (
        sets["early"]
        if end_spec == early_spec
        else _counted_set(end_spec, device, repetitions, folder, store, attempts)
    )
    last = sets["end"].pop("last_profiled")
    sets["early"].pop("last_profiled", None)
    return {
        "steps": STEPS,
        "early_window": list(EARLY),
        "repetitions": repetitions,
        "early_steps_set": sets["early"],
        "end_set": sets["end"],
        "early_steps": sets["early"]["early_steps"],
        "control_within_limit": sets["early"]["control_within_limit"],
        "attempts": sets["early"]["attempts"],
        "fit": sets["end"]["fit"],
        "delivered": delivered(last, store),
        "script": {
            "spec": SPECS[end_spec].describe(),
            **_script_set(end_spec, device, script_repetitions, folder, store),
        },
        "fresh_script_early": {
            "spec": SPECS[early_spec].describe(),
            **_script_set(early_spec, device, min(repetitions, FRESH_SCRIPT_REPETITIONS), folder, store),
        },
        "every_core": _every_core_set(early_spec, device, max(1, repetitions // 3), folder, store),
    }
