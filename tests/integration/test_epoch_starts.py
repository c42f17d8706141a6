"""Epoch starts: the time from a training epoch's start to its first batch is its own figure, not step time.

With `persistent_workers=False` every epoch starts the DataLoader's workers again (anemoi's dataset opens again
in each). Real fits on CPU with a worker start made slow (`worker_init_fn` sleeps), checked against a clock of
the test's own: the steady step time agrees with the cadence between batches of the same epoch, the epoch-start
figure with the time from each epoch's start to its first batch, and the diagnosis names persistent_workers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.reports.diagnosis import diagnose
from anemoi_profiler.reports.epoch_starts import EPOCH_START_SHARE
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.run_files.steps_file import NOT_STEADY, read_steps
from tests.helpers.jobs import FAST, MAX_STEPS, WARMUP_STEPS, job_command, only_run_folder, run_ok
from tests.helpers.lightning_models import TinyRegressor, trainer

WORKER_START_S = 0.3
"""How long each training DataLoader worker takes to start (its `worker_init_fn` sleeps)."""
VAL_WORKER_START_S = 0.5
STEP_S = 0.01
BATCHES_PER_EPOCH = 8
EPOCHS = 3
WARMUP = 3
BATCH = 16
CADENCE_TOLERANCE = 0.2
"""The profiler's steady step time is within 20% of the test's own mean cadence between batches of an epoch
(on 2 shared cores; an epoch start folded into the steps would make it 3x)."""
INDEPENDENT_EPOCH_START_TOLERANCE_S = 0.05
"""Per epoch start: the profiler's hooks and the test's callback run next to each other in the same hooks."""


def slow_worker_start(worker_id: int) -> None:
    time.sleep(WORKER_START_S)


def slow_val_worker_start(worker_id: int) -> None:
    time.sleep(VAL_WORKER_START_S)


class IndependentClock(pl.Callback):
    """Batches and epoch starts timed with the test's own `perf_counter`, listed after the profiler's callbacks."""

    def __init__(self) -> None:
        self.gaps: dict[int, float] = {}
        """By batch (from 1): the time since the previous batch's `on_train_batch_end`, for batches after the warmup
        (its steps pay one-off costs: the first `self.log`'s set-up took 0.3 s once) whose previous batch was of
        the same epoch, no validation between."""
        self._batches = 0
        self.epoch_start_s: dict[int, float] = {}
        """Per epoch: from its `on_train_epoch_start` to its first `on_train_batch_start`."""
        self._last_end: float | None = None
        self._epoch_started: float | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._last_end, self._epoch_started = None, time.perf_counter()

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if self._epoch_started is not None:
            self.epoch_start_s[trainer.current_epoch] = time.perf_counter() - self._epoch_started
            self._epoch_started = None

    def on_train_batch_end(self, *args: Any) -> None:
        now = time.perf_counter()
        self._batches += 1
        if self._last_end is not None and self._batches > WARMUP:
            self.gaps[self._batches] = now - self._last_end
        self._last_end = now

    @property
    def cadence_s(self) -> list[float]:
        return list(self.gaps.values())

    def on_validation_start(self, *args: Any) -> None:
        self._last_end = None


class EpochEndWork(pl.Callback):
    """Work at each epoch's end, as a checkpoint saved there: `on_train_epoch_end` sleeps `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_epoch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


def data(size: int, worker_init_fn: Any, persistent_workers: bool) -> DataLoader:
    x = torch.randn(size, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(
        TensorDataset(x, x.sum(1, keepdim=True)),
        batch_size=BATCH,
        num_workers=1,
        persistent_workers=persistent_workers,
        worker_init_fn=worker_init_fn,
    )


def fit(
    tmp_path: Path, persistent_workers: bool = False, validate: bool = False, epoch_end_s: float = 0.0
) -> tuple[Path, IndependentClock]:
    config = ProfilerConfig.load(
        None,
        [
            f"output_dir={tmp_path / 'runs'}",
            "tracking.enabled=false",
            "report.console=false",
            "report.html=false",
            "system.enabled=false",
            "log_every_n_steps=5",
            f"throughput.warmup_steps={WARMUP}",
        ],
    )
    clock = IndependentClock()
    train = data(BATCH * BATCHES_PER_EPOCH, slow_worker_start, persistent_workers)
    val = data(BATCH * 2, slow_val_worker_start, False) if validate else None
    options: dict[str, Any] = {"limit_val_batches": 2, "num_sanity_val_steps": 0} if validate else {}
    extra = [EpochEndWork(epoch_end_s)] if epoch_end_s else []
    trainer([*build_callbacks(config), clock, *extra], max_epochs=EPOCHS, **options).fit(
        TinyRegressor(step_sleep_s=STEP_S), train, val
    )
    (run_dir,) = run_folders(tmp_path / "runs")
    return run_dir, clock


def summary(run_dir: Path) -> dict[str, float]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {key.removeprefix(names.SUMMARY): points["value"][-1] for key, points in metrics.items()}


def measured_epoch_starts_s(clock: IndependentClock) -> float:
    """The test's own time at the starts of the epochs after the warmup (epoch 0's first batches are the warmup)."""
    return sum(seconds for epoch, seconds in clock.epoch_start_s.items() if epoch > 0)


def assert_steady_step_agrees_with_the_cadence(figures: dict[str, float], clock: IndependentClock) -> None:
    cadence_ms = mean(clock.cadence_s) * 1000
    assert figures["train/step_ms"] == pytest.approx(cadence_ms, rel=CADENCE_TOLERANCE), (
        f"profiler {figures['train/step_ms']:.1f} ms, own clock {cadence_ms:.1f} ms mean, "
        f"{median(clock.cadence_s) * 1000:.1f} ms median"
    )


def test_worker_start_up_at_each_epoch_is_its_own_figure_and_named_by_the_diagnosis(tmp_path: Path) -> None:
    run_dir, clock = fit(tmp_path)
    figures = summary(run_dir)

    assert_steady_step_agrees_with_the_cadence(figures, clock)
    starts = EPOCHS - 1
    assert figures["train/epoch_starts"] == starts
    assert figures["train/epoch_start_s"] >= starts * WORKER_START_S
    assert figures["train/epoch_start_s"] == pytest.approx(
        measured_epoch_starts_s(clock), abs=starts * INDEPENDENT_EPOCH_START_TOLERANCE_S
    )
    # The all-in rate counts every batch after the warmup over every second, the epoch starts in: its time holds
    # them at their share, and the steady rate (the epoch's first steps and the epoch starts left out) is faster.
    samples = (
        json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["data"]["train/measured_batches"]
        * BATCH
    )
    all_in_s = samples / figures["train/samples_per_sec_all_in"]
    assert figures["train/epoch_start_share"] == pytest.approx(figures["train/epoch_start_s"] / all_in_s)
    assert all_in_s > figures["train/epoch_start_s"] + samples / figures["train/samples_per_sec"] * 0.9
    assert figures["train/samples_per_sec_with_epoch_starts"] == figures["train/samples_per_sec_all_in"]

    throughput = json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]
    assert throughput["data"]["train/dataloader_workers"] == 1
    assert throughput["data"]["train/persistent_workers"] is False
    assert f"{starts} measured epoch start(s) took" in throughput["note"]
    (verdict,) = [v for v in diagnose(load_run(run_dir)) if v.id == "epoch-start-bound"]
    assert verdict.severity == "high"  # 0.3 s a start against 8 batches of about 12 ms
    assert f"of training time at {starts} epoch starts" in verdict.value
    assert "persistent_workers=True" in verdict.next_step
    assert "persistent_workers=False" in verdict.message


def test_persistent_workers_start_once_and_the_verdict_stays_quiet(tmp_path: Path) -> None:
    run_dir, clock = fit(tmp_path, persistent_workers=True)
    figures = summary(run_dir)

    assert_steady_step_agrees_with_the_cadence(figures, clock)
    assert figures["train/epoch_starts"] == EPOCHS - 1
    assert figures["train/epoch_start_share"] < EPOCH_START_SHARE
    assert "epoch-start-bound" not in {verdict.id for verdict in diagnose(load_run(run_dir))}


def test_work_at_an_epochs_end_is_in_no_steady_step(tmp_path: Path) -> None:
    """0.3 s at each epoch's end (another callback's `on_train_epoch_end`, as a checkpoint saved there) is the
    next epoch's first step's time, between two batch ends: left out with that step. Folded into the steady
    intervals it would make the step time several times the cadence; it stays in the all-in time."""
    run_dir, clock = fit(tmp_path, persistent_workers=True, epoch_end_s=WORKER_START_S)
    figures = summary(run_dir)

    # Each log interval's step time against the test's clock over that interval's steady steps: the intervals
    # after an epoch's end read about 6x the cadence when its work stays in them.
    step_ms = json.loads((run_dir / "metrics.json").read_text())[names.timing("train", "step_ms")]
    flags = read_steps(run_dir)["train"].flags
    previous = WARMUP
    for step, value in zip(step_ms["step"], step_ms["value"], strict=True):
        steady = [batch for batch in range(previous + 1, step + 1) if not flags[batch - 1] & NOT_STEADY]
        own_ms = mean(clock.gaps[batch] for batch in steady) * 1000
        assert value == pytest.approx(own_ms, rel=CADENCE_TOLERANCE), f"interval ending at step {step}"
        previous = step
    assert_steady_step_agrees_with_the_cadence(figures, clock)
    samples = (
        json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]["data"]["train/measured_batches"]
        * BATCH
    )
    all_in_s = samples / figures["train/samples_per_sec_all_in"]
    assert all_in_s > (EPOCHS - 1) * WORKER_START_S + figures["train/epoch_start_s"]


def test_validation_between_epochs_is_not_counted_as_an_epoch_start(tmp_path: Path) -> None:
    """The validation DataLoader's workers start slowly too (0.5 s, before every validation): that time is
    validation's, outside the epoch starts. (The step time is not compared with the cadence here: Lightning
    starts the validation DataLoader's worker processes before `on_validation_start`, and that fork stays in
    the last training batch's time; docs/metrics.md says so.)"""
    run_dir, clock = fit(tmp_path, validate=True)
    figures = summary(run_dir)

    starts = EPOCHS - 1
    assert figures["train/epoch_starts"] == starts
    assert figures["train/epoch_start_s"] == pytest.approx(
        measured_epoch_starts_s(clock), abs=starts * INDEPENDENT_EPOCH_START_TOLERANCE_S
    )
    assert figures["train/epoch_start_s"] < starts * (WORKER_START_S + VAL_WORKER_START_S)
    assert figures["val/step_ms"] > 0


@pytest.mark.slow
def test_two_ranks_restarting_their_workers_every_epoch(tmp_path: Path) -> None:
    """DDP with gloo in real processes (`tests/helpers/fault_job.py`): each rank's DataLoader worker takes 0.3 s to
    start, every epoch. The ranks exchange their epoch starts; the longest is every rank's (the others wait for
    it in the epoch's first step), and the diagnosis names it. (The step time is not compared with a cadence
    here: on our loaded 2-core VM the first step after a worker start was sometimes slower by hundreds of ms,
    which stays in the steps; docs/metrics.md says so.)"""
    output_dir = tmp_path / "runs"
    epochs = 4
    run_ok(
        job_command(
            "--devices=2",
            f"--output-dir={output_dir}",
            f"--epochs={epochs}",
            f"--worker-start-ms={WORKER_START_S * 1000:.0f}",
            *FAST,
            "tracking.enabled=false",
            "system.enabled=false",
        ),
        tmp_path,
    )
    run_dir = only_run_folder(output_dir)
    figures = summary(run_dir)

    starts = epochs - 1  # the warmup ends in the first epoch
    assert figures["train/epoch_starts"] == starts
    assert figures["train/epoch_start_s"] >= starts * WORKER_START_S
    throughput = json.loads((run_dir / "report.json").read_text())["sections"]["Throughput"]
    assert throughput["data"]["train/measured_batches"] == 2 * (MAX_STEPS - WARMUP_STEPS)
    assert throughput["data"]["train/persistent_workers"] is False
    assert "took" in throughput["note"] and "(the rank with the longest: the others wait for it)" in throughput["note"]
    (verdict,) = [v for v in diagnose(load_run(run_dir)) if v.id == "epoch-start-bound"]
    assert "persistent_workers=True" in verdict.next_step
