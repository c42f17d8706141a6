"""Check what one `anemoi-training train` with the profiler left in anemoi's MLflow store (ci/anemoi/run.sh).

Fails (exit 1, naming each broken promise) unless: the store holds exactly one run, FINISHED, with anemoi's own
metrics and the profiler's `throughput/`, `time/`, `system/` and `summary/` metrics, its tags, description and
`profiler/` artifacts; grid points per sample equal the dataset's grid; the measured batches equal the batches
the independent clock (batch_clock.py) counted after warmup, on every rank; samples/s agrees with that clock
(see `clock_rates`);
no second store was written (`./mlruns` of the working directory, `mlflow.db` in the profiler's folder).
With --detailed also the model summary (its forward pass run, its parameters `sum(p.numel())` of anemoi's
model), the trace windows, the time report and HTA's results.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.run_files.steps_file import NOT_STEADY, read_steps

PROFILER_METRICS = (
    "throughput/train/samples_per_sec",
    "throughput/train/items_per_sec",
    "throughput/val/samples_per_sec",
    "time/train/step_ms",
    "time/train/dataloader_wait_ms",
    "system/cpu_utilization_percentage",
    "system/system_memory_usage_megabytes",
    "summary/train/samples_per_sec",
    "summary/train/items_per_sec",
)
ANEMOI_METRICS = ("epoch", "train_multi_dataset_loss_epoch", "val_multi_dataset_loss_epoch")
TAGS = ("profiler.verdict", "profiler.device", "profiler.world_size", "profiler.strategy", "profiler.precision")
RATE_TOLERANCE = 0.10
SAME_BATCHES_TOLERANCE = 0.03
"""The profiler's samples/s against the clock's over the very batches it counted as steady: one figure, so only
the two clocks' placement of a batch's edges may differ."""


def clock_rates(clock: dict[str, Any], warmup: int) -> dict[str, float]:
    """The two samples/s a profiler may honestly report, by the clock (check: within 10 % of either).

    All-in: samples after the warmup batches over the time from the warmup's end to the last batch, validation
    taken out (epoch starts, the dataloader's workers starting again, stay in). Steady: the median time between
    consecutive batches of one epoch with no validation between them. The profiler's steady rate leaves out
    epoch starts and its own work (the detailed preset's windows), which the all-in rate keeps and the steady
    cadence never sees, and it averages steps where the cadence takes a median: it lies between the two.
    """
    batches, validations = clock["batches"], clock["validations"]
    start, end = batches[warmup - 1]["t"], batches[-1]["t"]
    validation_s = sum(min(b, end) - max(a, start) for a, b in validations if b > start and a < end)
    samples = sum(batch["samples"] for batch in batches[warmup:])
    all_in = samples / (end - start - validation_s)
    gaps = [
        (later["t"] - earlier["t"], later["samples"])
        for earlier, later in itertools.pairwise(batches)
        if earlier["epoch"] == later["epoch"] and not any(earlier["t"] < a < later["t"] for a, _ in validations)
    ]
    steady = statistics.median(samples / gap for gap, samples in gaps)
    return {"all-in": all_in, "steady": steady}


def steady_clock_rate(
    clock: dict[str, Any], warmup: int, slow_steps: set[int], every: int, left_out: list[bool]
) -> float:
    """samples/s by the clock over the batches the profiler counted as steady: after the warmup, not among those
    `steps.json` flags as left out (`left_out`, by batch in order: a profiling window's, the profiler's own work,
    epoch starts), outside the log intervals (`every` steps, named by the step they end at; the last one ends at
    the last step) it set apart as slow stretches; each batch's time is the gap since the batch before it,
    validation taken out."""
    batches, validations = clock["batches"], clock["validations"]
    last_step = batches[-1]["step"]
    samples = seconds = 0.0
    for index, (earlier, later) in enumerate(itertools.pairwise(batches[warmup - 1 :]), start=warmup):
        if min(-(-later["step"] // every) * every, last_step) in slow_steps:
            continue
        if index < len(left_out) and left_out[index]:
            continue
        gap = later["t"] - earlier["t"]
        gap -= sum(
            min(b, later["t"]) - max(a, earlier["t"]) for a, b in validations if earlier["t"] < b and a < later["t"]
        )
        samples, seconds = samples + later["samples"], seconds + gap
    return samples / seconds


def check(args: argparse.Namespace) -> list[str]:
    problems: list[str] = []
    client = MlflowClient(args.tracking_uri)
    runs = [run for experiment in client.search_experiments() for run in client.search_runs([experiment.experiment_id])]
    if len(runs) != 1:
        return [f"expected exactly one MLflow run in {args.tracking_uri}, found {len(runs)}"]
    run = runs[0]
    metrics, tags = run.data.metrics, run.data.tags
    print(f"run {run.info.run_id}: {run.info.status}, {len(metrics)} metrics")
    if run.info.status != "FINISHED":
        problems.append(f"run status {run.info.status}")
    problems += [f"anemoi's metric {key} missing" for key in ANEMOI_METRICS if key not in metrics]
    problems += [f"profiler metric {key} missing" for key in PROFILER_METRICS if key not in metrics]
    problems += [f"tag {key} missing" for key in TAGS if key not in tags]
    if "anemoi-profiler" not in tags.get("mlflow.note.content", ""):
        problems.append("the run's description has no anemoi-profiler diagnosis")

    with tempfile.TemporaryDirectory() as scratch:
        report_file = client.download_artifacts(run.info.run_id, "profiler/report.json", scratch)
        report = json.loads(Path(report_file).read_text())
        artifacts = {item.path for item in client.list_artifacts(run.info.run_id, "profiler")}
    for name in ("config.yaml", "environment.json", "report.txt", "report.json", "report.html"):
        if f"profiler/{name}" not in artifacts:
            problems.append(f"artifact profiler/{name} missing")

    clock = json.loads(Path(args.clock).read_text())
    samples_per_sec = metrics.get("summary/train/samples_per_sec", 0.0)
    points_per_sample = metrics.get("summary/train/items_per_sec", 0.0) / samples_per_sec if samples_per_sec else 0.0
    print(f"grid points per sample: {points_per_sample:.3f} (dataset grid {args.grid})")
    if abs(points_per_sample - args.grid) > 1e-6 * args.grid:
        problems.append(f"items per sample {points_per_sample:.3f}, not the grid's {args.grid} points")

    throughput = report["sections"].get("Throughput", {}).get("data", {})
    measured = throughput.get("train/measured_batches")
    # The batches every rank measured: the clock's (rank 0's) after warmup, on each rank.
    expected = (len(clock["batches"]) - args.warmup) * clock["world_size"]
    print(
        f"measured batches: {measured} (clock: {len(clock['batches'])} trained, {args.warmup} warmup, "
        f"{clock['world_size']} rank(s))"
    )
    if measured != expected:
        problems.append(f"train/measured_batches {measured}, the clock counted {expected} after warmup")

    rates = clock_rates(clock, args.warmup)
    low, high = rates["all-in"] * (1 - RATE_TOLERANCE), rates["steady"] * (1 + RATE_TOLERANCE)
    slow = str(throughput.get("train/slow_stretch_intervals", ""))
    slow_steps: set[int] = set()
    if "ending at step" in slow:
        slow_steps = {int(step) for step in slow.split("ending at step")[1].strip(" )").split(",")}
    folders = run_folders(args.profiler_dir)
    series = read_steps(folders[-1]).get("train") if folders else None
    left_out = [] if series is None else [bool(flags & NOT_STEADY) for flags in series.flags]
    same = steady_clock_rate(clock, args.warmup, slow_steps, args.log_every, left_out)
    # Slow stretches set apart: the figure may also reach the clock's rate over the same batches.
    low, high = min(low, same * (1 - RATE_TOLERANCE)), max(high, same * (1 + RATE_TOLERANCE))
    # The clock runs on rank 0 and times rank 0's batches: with several ranks, the profiler's rank-0 (device) rate
    # is its figure over the same batches; the global one also holds the other ranks' (checked against the band).
    rank0_key = "summary/train/device/samples_per_sec" if clock["world_size"] > 1 else "summary/train/samples_per_sec"
    rank0 = metrics.get(rank0_key, 0.0)
    print(
        f"samples/s: profiler {samples_per_sec:.3f} (rank 0: {rank0:.3f}); the clock over the same steady batches"
        f" {same:.3f} (slow stretches set apart at steps {sorted(slow_steps)}), all-in {rates['all-in']:.3f},"
        f" steady {rates['steady']:.3f}"
    )
    if abs(rank0 / same - 1) > SAME_BATCHES_TOLERANCE:
        problems.append(
            f"{rank0_key} {rank0:.3f} is not the clock's {same:.3f} over the same batches"
            f" (within {SAME_BATCHES_TOLERANCE:.0%})"
        )
    if not low <= samples_per_sec <= high:
        problems.append(
            f"summary/train/samples_per_sec {samples_per_sec:.3f} outside the clock's all-in and steady rates"
            f" ({low:.3f} to {high:.3f}, {RATE_TOLERANCE:.0%} either side)"
        )

    if args.detailed:
        problems += check_detailed(report, artifacts, clock)

    stray = [path for path in (Path(args.workdir) / "mlruns", Path(args.profiler_dir) / "mlflow.db") if path.exists()]
    problems += [f"a second MLflow store was written: {path}" for path in stray]
    return problems


def check_detailed(report: dict[str, Any], artifacts: set[str], clock: dict[str, Any]) -> list[str]:
    problems = []
    summary = report["sections"].get("Model summary", {}).get("data", {})
    print(f"model summary: {summary}")
    if summary.get("total params") != clock["model_parameters"]:
        problems.append(
            f"model summary: {summary.get('total params')} params, sum(p.numel()) is {clock['model_parameters']}"
        )
    if "called as" not in summary:
        problems.append(f"model summary without its forward pass: {summary.get('static summary because')}")
    for name in ("model_summary.txt", "traces", "time_report.csv", "hta"):
        if f"profiler/{name}" not in artifacts:
            problems.append(f"artifact profiler/{name} missing")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tracking-uri", required=True, help="anemoi's MLflow store (file: URI in offline mode)")
    parser.add_argument("--clock", required=True, help="the JSON file batch_clock.py wrote")
    parser.add_argument("--workdir", required=True, help="the working directory of the training")
    parser.add_argument("--profiler-dir", required=True, help="the profiler's output_dir")
    parser.add_argument("--grid", type=int, default=288, help="grid points of the dataset")
    parser.add_argument("--warmup", type=int, default=5, help="the profiler's throughput.warmup_steps")
    parser.add_argument("--log-every", type=int, default=5, help="log_every_n_steps of the config (its intervals)")
    parser.add_argument("--detailed", action="store_true", help="the run used the detailed preset")
    problems = check(parser.parse_args())
    for problem in problems:
        print(f"FAIL: {problem}")
    print("anemoi-e2e: OK" if not problems else f"anemoi-e2e: {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
