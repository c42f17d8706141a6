"""One figure, one number: a run's steady samples/s and step time are the same in every output, and agree with a
clock of the test's own over the same batches.

Real CPU fits: one whose first log interval after the warmup is slow (a callback sleeps in its first batches), read
from the console, report.json, report.html, the MLflow run (summary metrics and description, sqlite store) and
`compare`; and a short one with a single log interval, gradient accumulation and a checkpoint at its end.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.report_sections import format_value
from anemoi_profiler.reports import steady
from anemoi_profiler.reports.compare import compare_runs, format_text
from anemoi_profiler.reports.description import md
from anemoi_profiler.reports.diagnosis import diagnose
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.run_files.steps_file import PROFILED, read_steps
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

WARMUP = 3
LOG_EVERY = 10
BATCH = 16
SLOW_BATCHES = WARMUP + LOG_EVERY
"""The slow start covers the warmup and the whole first log interval after it."""
SLOW_S = 0.03
AGREEMENT = 0.01


class SlowStart(pl.Callback):
    """Sleeps before each of the first `batches` training batches: a stand-in for a slow start."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.fit_loop.total_batch_idx < self.batches:
            time.sleep(SLOW_S)


class SlowSave(pl.Callback):
    """A checkpoint that takes a while to write, as a large model's does."""

    def on_save_checkpoint(self, *args: Any) -> None:
        time.sleep(0.2)


class BatchEnds(pl.Callback):
    """The test's own clock: `perf_counter` at every training batch's end, listed before the profiler's callbacks:
    the two clocks read one after the other, whatever the profiler then does in its hooks (on a loaded machine a
    clock read after them drifted by milliseconds at an interval's end)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def intervals(self, warmup: int, every: int) -> list[steady.Interval]:
        """The log intervals after the warmup as the profiler cuts them, timed by this clock."""
        bounds = [*range(warmup - 1, len(self.ends) - 1, every), len(self.ends) - 1]
        return [
            steady.Interval(end, end - start, self.ends[end] - self.ends[start])
            for start, end in itertools.pairwise(bounds)
            if end > start
        ]


def config(tmp_path: Path, *overrides: str) -> ProfilerConfig:
    return ProfilerConfig.load(
        "simple",
        [
            f"output_dir={tmp_path / 'runs'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "system.enabled=false",
            "model_summary.enabled=false",
            f"throughput.warmup_steps={WARMUP}",
            *overrides,
        ],
    )


def own_figures(clock: BatchEnds, every: int, slow_steps: set[int] | None = None) -> tuple[float, float]:
    """samples/s and step ms over the steady intervals of the test's own clock. The slow stretches are the ones the
    profiler set apart (`slow_steps`, the global steps they end at) where given: an interval near the threshold
    (1.5x the median) may fall on either side of it by two clocks; else the published definition decides."""
    intervals = clock.intervals(WARMUP, every)
    if slow_steps is None:
        chosen = steady.split(intervals).steady
    else:  # an interval ending at batch index `step` ends at global step `step + 1`
        chosen = [interval for interval in intervals if interval.step + 1 not in slow_steps]
    batches = sum(interval.batches for interval in chosen)
    seconds = sum(interval.seconds for interval in chosen)
    return batches * BATCH / seconds, seconds / batches * 1000


def slow_stretch_steps(run_dir: Path) -> set[int]:
    """The global steps at which the intervals the profiler set apart as slow stretches end (report.json)."""
    throughput = json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["data"]
    text = str(throughput.get("train/slow_stretch_intervals", ""))
    return (
        {int(step) for step in text.split("ending at step")[1].strip(" )").split(",")} if "ending at" in text else set()
    )


@pytest.mark.slow
def test_a_slow_start_is_set_apart_and_every_output_shows_the_same_steady_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = BatchEnds()
    callbacks = [clock, *build_callbacks(config(tmp_path, f"log_every_n_steps={LOG_EVERY}")), SlowStart(SLOW_BATCHES)]
    train, _ = loaders(n_train=70 * BATCH, batch_size=BATCH)
    trainer(callbacks).fit(TinyRegressor(), train)
    console = capsys.readouterr().out
    (run_dir,) = run_folders(tmp_path / "runs")
    run = load_run(run_dir)

    samples_per_sec = run.steady(names.TRAIN_SAMPLES_PER_SEC)
    step_ms = run.steady(names.TRAIN_STEP_MS)
    assert samples_per_sec is not None and step_ms is not None
    slow_steps = slow_stretch_steps(run_dir)
    assert WARMUP + LOG_EVERY in slow_steps  # the slow start's interval
    own_rate, own_step_ms = own_figures(clock, LOG_EVERY, slow_steps)
    assert samples_per_sec == pytest.approx(own_rate, rel=AGREEMENT)
    assert step_ms == pytest.approx(own_step_ms, rel=AGREEMENT)
    assert samples_per_sec * step_ms / 1000 == pytest.approx(BATCH, rel=1e-6)  # one set of batches behind both

    # The slow start is a figure of its own, and the diagnosis names it.
    assert run.last(names.slow_stretch("train", "share")) > 0.3
    slow_rate = run.last(names.slow_stretch("train", "samples_per_sec"))
    assert slow_rate < samples_per_sec / 3
    (verdict,) = [verdict for verdict in diagnose(run) if verdict.id == "slow-stretch"]
    assert f"{slow_rate:.4g} samples/s there against {samples_per_sec:.4g} steady" in verdict.value

    # Every output shows these numbers, named.
    rate_text, step_text = format_value(samples_per_sec, "/s"), format_value(step_ms, "ms")
    throughput = json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]
    assert throughput["data"]["train/samples_per_sec"] == samples_per_sec
    assert steady.LABEL in throughput["note"]
    timing = json.loads((run_dir / "report.json").read_text())["sections"]["Step time and memory"]
    assert timing["data"]["train/step_ms"] == step_ms
    assert rate_text in console and step_text in console and "slow_stretch_share" in console
    assert rate_text in (run_dir / "report.txt").read_text()
    page = (run_dir / "report.html").read_text()
    assert f"<b>{format_value(samples_per_sec)}</b><span>training samples/s</span>" in page
    assert f"<b>{step_text}</b><span>training step</span>" in page
    assert steady.LABEL.replace("'", "&#x27;") in page

    wait_for_mlflow()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert mlflow_run.data.metrics[names.SUMMARY_TRAIN_SAMPLES_PER_SEC] == pytest.approx(samples_per_sec, rel=1e-9)
    assert mlflow_run.data.metrics[names.summary_of(names.TRAIN_STEP_MS)] == pytest.approx(step_ms, rel=1e-9)
    description = mlflow_run.data.tags["mlflow.note.content"]
    assert f"training samples/s **{format_value(samples_per_sec)}**" in description
    assert md(steady.LABEL.capitalize()) in description

    comparison = compare_runs(run, run)
    figures = {difference.label: difference.a for difference in comparison.metrics}
    assert figures["training samples/s"] == samples_per_sec
    assert figures["training step"] == step_ms
    assert rate_text in format_text(comparison)


@pytest.mark.slow
def test_a_short_run_with_one_log_interval_agrees_with_a_clock_around_its_batches(tmp_path: Path) -> None:
    """42 batches, gradient accumulation 2, the default log interval (one interval), a checkpoint saved at the end:
    what ran after the last batch is no batch's."""
    clock = BatchEnds()
    profiler = build_callbacks(config(tmp_path, "tracking.enabled=false", "report.console=false"))
    callbacks = [clock, *profiler, SlowSave()]
    train, _ = loaders(n_train=42 * BATCH, batch_size=BATCH)
    fit = trainer(
        callbacks, accumulate_grad_batches=2, enable_checkpointing=True, default_root_dir=tmp_path / "checkpoints"
    )
    fit.fit(TinyRegressor(width=256), train)
    (run_dir,) = run_folders(tmp_path / "runs")
    run = load_run(run_dir)

    own_rate, own_step_ms = own_figures(clock, 10**6)
    assert run.steady(names.TRAIN_SAMPLES_PER_SEC) == pytest.approx(own_rate, rel=AGREEMENT)
    assert run.steady(names.TRAIN_STEP_MS) == pytest.approx(own_step_ms, rel=AGREEMENT)
    assert run.last(names.slow_stretch("train", "share")) is None  # one interval: nothing to set apart


def test_slow_stretches_are_intervals_over_one_and_a_half_times_the_median() -> None:
    intervals = [steady.Interval(10 * k, 10, 0.01, {names.TRAIN_STEP_MS: 1.0}) for k in range(1, 5)]
    slow = steady.Interval(50, 10, 0.05, {names.TRAIN_STEP_MS: 5.0})
    split = steady.split([slow, *intervals])
    assert split.slow == [slow] and split.steady == intervals
    assert steady.combined(split.steady) == {names.TRAIN_STEP_MS: 1.0}


WINDOW_START, WINDOW_STEPS = 20, 12
"""A torch.profiler window over batches 20-31 (wait 1, warmup 1, active 10), the detailed preset's length."""
WINDOW_SLEEP_S = 0.1


class SlowWindow(pl.Callback):
    """Sleeps in each step of the profiling window: its steps run far slower than the rest, as under a profiler."""

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if WINDOW_START <= trainer.fit_loop.total_batch_idx < WINDOW_START + WINDOW_STEPS:
            time.sleep(WINDOW_SLEEP_S)


def test_a_profiling_windows_steps_are_out_of_the_headline_and_in_the_all_in_rate(tmp_path: Path) -> None:
    """60 batches of 10 ms after a warmup of 3, 12 of them in a profiling window sleeping 100 ms each. The headline
    counts no window step (no more batches than steps.json marks steady), and reads at least 1.5x the all-in rate,
    which counts every batch after the warmup and the window's 1.2 s."""
    window = [
        "profiler.enabled=true",
        "profiler.validation=false",
        f"profiler.train.skip_first={WINDOW_START}",
        "profiler.train.wait=1",
        "profiler.train.warmup=1",
        f"profiler.train.active={WINDOW_STEPS - 2}",
        "profiler.train.repeat=1",
    ]
    callbacks = [*build_callbacks(config(tmp_path, "log_every_n_steps=10", "tracking.enabled=false", *window))]
    train, _ = loaders(n_train=60 * BATCH, batch_size=BATCH)
    trainer([*callbacks, SlowWindow()]).fit(TinyRegressor(step_sleep_s=0.01), train)
    (run_dir,) = run_folders(tmp_path / "runs")
    run = load_run(run_dir)

    flags = read_steps(run_dir)["train"].flags
    assert int(np.count_nonzero(flags & PROFILED)) == WINDOW_STEPS
    throughput = json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["data"]
    assert throughput["train/measured_batches"] == 60 - WARMUP
    assert throughput["train/steady_batches"] <= int(np.count_nonzero(flags == 0))
    assert throughput["train/left_out_batches"] >= WINDOW_STEPS
    headline = run.steady(names.TRAIN_SAMPLES_PER_SEC)
    all_in = run.last(names.SUMMARY_TRAIN_SAMPLES_PER_SEC_ALL_IN)
    assert headline is not None and all_in is not None
    assert headline > 1.5 * all_in
    assert run.steady(names.TRAIN_STEP_MS) < WINDOW_SLEEP_S * 1000 / 2  # no window step in the step time
    # the per-interval series is of the steady steps too: no interval reads the window's pace
    _, rates = run.series(names.TRAIN_SAMPLES_PER_SEC)
    assert rates and min(rates) > BATCH / WINDOW_SLEEP_S
