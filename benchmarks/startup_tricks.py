"""What each of the profiler's start-up and hot-path tricks buys: every trick with and without it, in one run.

    python benchmarks/startup_tricks.py --out benchmarks/results/cpu_startup_tricks_<date>.json
        [--repetitions 6] [--steady-steps 1000] [--settings end,probe,...] [--until HH:MM]
    python benchmarks/startup_tricks.py --out RESULTS.json --table   # print a results file's figures

A trick of `anemoi_profiler.tracking.startup` is left out by naming it in `_ANEMOI_PROFILER_WITHOUT`, which only
this harness sets; the MLflow sender, a child process, inherits it. The tricks it measured and that were removed
(see docs/benchmarks.md) have no switch any more; their figures stay in that run's results file.

Each repetition runs every setting below, the configurations of a setting in an order rotated per repetition;
every figure is a difference or ratio to the bare fit of the same repetition, and a second bare fit
(`bare (control)`) is the noise floor. Figures are medians over repetitions. All fits run on one torch thread;
each profiled fit but the later run is the first of its process (the sender kept from the fit before is ended
first).

- `end`: `fit()` of the "1 ms" model, 160 steps (the short run whose end waits for the sender's start-up).
- `callbacks_first`: the same with the callbacks built `SETUP_S` before the Trainer (what a prestart overlaps).
- `later_run`: `fit()` of a second run in the same process (what a kept sender buys).
- `early`: the median step over batches 40-160 of the "5 ms" model, as a ratio to bare; and what the callbacks
  add to those steps on the training thread, read within each fit (`step_parts.StepParts`), in points over bare.
- `steady`: the mean step after 20 batches of the "50 ms" model (`--steady-steps`), as a ratio to bare, and
  `fit()`; groups of tricks left out together (`startup`: the sender's, `hot_path`: the hooks').
- `probe`: the training thread's cost of our hooks per batch, through Lightning's dispatcher (`measure.HookLoop`
  in a fit of the "50 ms" model): the best block's µs, and that as a share of the bare step timed just before.
- `script`: a fresh interpreter that fits the "1 ms" model and exits, from start to exit.
- `sender_start`: a fresh sender's start-up alone (what a short first run's end waits for), in a process of its
  own: its CPU time, which the machine's load hardly moves, and its wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from measure import HookLoop
from models import SPECS, make_loader, make_model, make_trainer, quiet_lightning
from short_run import EARLY, SCRIPT, SETUP_S, BatchEnds, early_step_ms, profiled_callbacks, stand_in_setup
from step_parts import StepParts, share_pct

from anemoi_profiler.tracking import sender
from anemoi_profiler.tracking.startup import WITHOUT_VARIABLE

SENDER_TRICKS = ("prestart", "kept_sender", "idle_import", "leave_out_imports", "gc_freeze")
HOT_PATH_TRICKS = ("hooks_none", "quiet_profiler")
GROUPS = {"startup": SENDER_TRICKS, "hot_path": HOT_PATH_TRICKS}
STEADY_MS = 50.0
STEADY_WARMUP = 20


def bare(name: str = "bare") -> tuple[str, tuple[str, ...] | None]:
    return name, None


def ours(*without: str) -> tuple[str, tuple[str, ...]]:
    return (f"ours without {'+'.join(without)}" if without else "ours"), without


SETTINGS: dict[str, list[tuple[str, tuple[str, ...] | None]]] = {
    "end": [bare(), bare("bare (control)"), ours(), *(ours(trick) for trick in SENDER_TRICKS)],
    "callbacks_first": [ours(), ours("prestart")],
    "later_run": [ours(), ours("kept_sender")],
    "early": [bare(), bare("bare (control)"), ours(), *(ours(t) for t in SENDER_TRICKS + HOT_PATH_TRICKS)],
    "steady": [bare(), bare("bare (control)"), ours(), *(ours(*tricks) for tricks in GROUPS.values())],
    "probe": [ours(), ("ours (control)", ()), *(ours(trick) for trick in HOT_PATH_TRICKS)],
    "script": [bare(), bare("bare (control)"), ours(), *(ours(t) for t in SENDER_TRICKS if t != "kept_sender")],
    "sender_start": [
        ours(),
        ("ours (control)", ()),
        *(ours(t) for t in ("leave_out_imports", "gc_freeze")),
    ],
}
SENDER_START = "from anemoi_profiler.tracking import sender; sender._import_mlflow(sender.store_module_for('sqlite:'))"
"""What a sender does before it reads its first request."""


@contextlib.contextmanager
def leaving_out(tricks: tuple[str, ...]) -> Iterator[None]:
    before = os.environ.get(WITHOUT_VARIABLE)
    os.environ[WITHOUT_VARIABLE] = ",".join(tricks)
    try:
        yield
    finally:
        if before is None:
            del os.environ[WITHOUT_VARIABLE]
        else:
            os.environ[WITHOUT_VARIABLE] = before


def fit(spec_name: str, steps: int, work_dir: Path, store: str, tricks: tuple[str, ...] | None, **how: Any) -> dict:
    """One fit, bare (`tricks` None) or profiled without `tricks`; `how`: callbacks_first, probe, later_run."""
    spec = SPECS[spec_name]
    sender.end_kept()  # the first run of a process (for a later run: the fit just before left its sender)
    with leaving_out(tricks or ()):
        if how.get("later_run"):
            fit(spec_name, steps, work_dir, store, tricks)
        callbacks: list[Any] = []
        if tricks is not None and how.get("callbacks_first"):
            callbacks = profiled_callbacks(work_dir, store)
            stand_in_setup(SETUP_S)
        model, loader = make_model(spec), make_loader(spec, steps)
        if tricks is not None and not how.get("callbacks_first"):
            callbacks = profiled_callbacks(work_dir, store)
        clock, parts = BatchEnds(sync_cuda=False), StepParts(*EARLY)
        probe = HookLoop(callbacks, after_batch=20, blocks=10, per_block=100, between=5) if how.get("probe") else None
        trainer = make_trainer(spec, "cpu", steps, [*callbacks, clock, *([probe] if probe else [parts])])
        with (work_dir / "fit.log").open("a") as log, contextlib.redirect_stdout(log):
            started = time.perf_counter()
            trainer.fit(model, loader)
            fit_s = time.perf_counter() - started
    ends = clock.ends
    row = {"fit_s": fit_s, "steps": len(ends)}
    if len(ends) >= 160:
        row["early_step_ms"] = early_step_ms(ends)
        per_batch = parts.per_batch_us()
        row["parts_pct"] = share_pct(per_batch, row["early_step_ms"]) if per_batch else None
    if len(ends) > STEADY_WARMUP:
        row["steady_step_ms"] = (ends[-1] - ends[STEADY_WARMUP - 1]) / (len(ends) - STEADY_WARMUP) * 1000
    if probe is not None:
        row["probe"] = summary = probe.summary()
        row["probe_best_us"] = summary["best_us"]
        row["probe_share_pct"] = summary["best_us"] / summary["bare_step_us"] * 100
    return row


def script(work_dir: Path, store: str, tricks: tuple[str, ...] | None) -> dict:
    command = [sys.executable, str(SCRIPT), "--spec", "cpu", "--steps", "160", "--work-dir", str(work_dir)]
    if tricks is not None:
        command += ["--profiled", "--store", store]
    env = {**os.environ, WITHOUT_VARIABLE: ",".join(tricks or ())}
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    wall_s = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(f"script exited {completed.returncode}: {completed.stderr[-2000:]}")
    return {"wall_s": wall_s, "fit_s": json.loads(completed.stdout.strip().splitlines()[-1])["fit_s"]}


def sender_start(tricks: tuple[str, ...]) -> dict:
    env = {**os.environ, WITHOUT_VARIABLE: ",".join(tricks)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", SENDER_START], check=True, timeout=600, env=env)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"cpu_s": cpu_s, "wall_s": wall_s}


def run_setting(setting: str, repetition: int, work_dir: Path, store: str, steady_steps: int) -> list[dict]:
    configurations = SETTINGS[setting]
    shift = repetition % len(configurations)
    rows = []
    for name, tricks in configurations[shift:] + configurations[:shift]:
        if setting == "script":
            row = script(work_dir, store, tricks)
        elif setting == "sender_start":
            row = sender_start(tricks or ())
        elif setting == "steady":
            row = fit("cpu-50ms", steady_steps, work_dir, store, tricks)
        elif setting == "early":
            row = fit("cpu-5ms", 160, work_dir, store, tricks)
        elif setting == "probe":
            row = fit("cpu-50ms", 70, work_dir, store, tricks, probe=True)
        else:
            row = fit("cpu", 160, work_dir, store, tricks, **{setting: True})
        rows.append({"setting": setting, "repetition": repetition, "configuration": name, **row})
        print(f"  {setting:16} {name:40} {json.dumps({k: v for k, v in row.items() if k != 'probe'})}", file=sys.stderr)
    return rows


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Per setting and configuration: the median over repetitions of its difference (or ratio) to bare."""

    def value(setting: str, name: str, repetition: int, key: str) -> float | None:
        for row in rows:
            if (row["setting"], row["configuration"], row["repetition"]) == (setting, name, repetition):
                return row.get(key)
        return None

    figures: dict[str, Any] = {}
    measures = {
        "end": [("fit_s", "end", "diff")],
        "callbacks_first": [("fit_s", "end", "diff")],
        "later_run": [("fit_s", "end", "diff")],
        "early": [("early_step_ms", "early", "ratio"), ("parts_pct", "early", "diff")],
        "steady": [("steady_step_ms", "steady", "ratio"), ("fit_s", "steady", "diff")],
        "probe": [("probe_best_us", None, "raw"), ("probe_share_pct", None, "raw")],
        "script": [("wall_s", "script", "diff"), ("fit_s", "script", "diff")],
        "sender_start": [("cpu_s", None, "raw"), ("wall_s", None, "raw")],
    }
    repetitions = sorted({row["repetition"] for row in rows})
    for setting, configurations in SETTINGS.items():
        for key, bare_setting, kind in measures[setting]:
            table = figures.setdefault(f"{setting}:{key}", {})
            for name, _ in configurations:
                values = []
                for repetition in repetitions:
                    mine = value(setting, name, repetition, key)
                    base = value(bare_setting, "bare", repetition, key) if bare_setting else None
                    if mine is None or (kind != "raw" and base is None):
                        continue
                    if kind == "diff":
                        values.append(mine - base)
                    else:
                        values.append((mine / base - 1) * 100 if kind == "ratio" else mine)
                if values:
                    table[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return figures


def print_table(results: dict[str, Any]) -> None:
    """Each setting's figures (median [min, max] over repetitions), bare (control) and ours first."""
    for figure, configurations in results["figures"].items():
        print(f"{figure}")
        for name, value in configurations.items():
            if isinstance(value, dict):
                print(f"  {name:44} {value['median']:+9.3f} [{value['min']:+.3f}, {value['max']:+.3f}]")
            else:
                print(f"  {name:44} {value:9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table", action="store_true", help="print the figures of the results file --out")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/startup_tricks"))
    parser.add_argument("--repetitions", type=int, default=6)
    parser.add_argument("--steady-steps", type=int, default=1000)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--until", help="UTC HH:MM: start no repetition after it")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(args.out.read_text()))
        return
    torch.set_num_threads(1)
    quiet_lightning()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{args.work_dir / 'mlflow.db'}"
    if set(args.settings.split(",")) - {"sender_start"}:
        fit("cpu", 160, args.work_dir, store, ())  # warm store: the schema is created once
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "steady_steps": args.steady_steps,
        "specs": {name: SPECS[name].describe() for name in ("cpu", "cpu-5ms", "cpu-50ms")},
    }
    rows: list[dict] = []
    for repetition in range(args.repetitions):
        if args.until and datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M") >= args.until:
            break
        print(f"repetition {repetition + 1}", file=sys.stderr)
        for setting in args.settings.split(","):
            rows += run_setting(setting, repetition, args.work_dir, store, args.steady_steps)
        meta["repetitions"] = repetition + 1
        results = {"meta": meta, "figures": summarize(rows), "rows": rows}
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    sender.end_kept()


if __name__ == "__main__":
    main()
