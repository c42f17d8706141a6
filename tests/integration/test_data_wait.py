"""Data wait that is data wait: the fetch itself is timed, other callbacks' time is its own figure, and neither a
user's callback nor a checkpoint save is ever reported as waiting for data. Real CPU fits."""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.utilities import CombinedLoader
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.clock import LoopTimer
from anemoi_profiler.reports.diagnosis import diagnose
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

BUSY_S = 0.025
SLOW_FETCH_S = 0.02


def fast_config(tmp_path: Path, *overrides: str) -> ProfilerConfig:
    return ProfilerConfig.load(
        None,
        [
            f"output_dir={tmp_path / 'runs'}",
            "tracking.enabled=false",
            "report.console=false",
            "report.html=false",
            "system.enabled=false",
            "log_every_n_steps=5",
            "throughput.warmup_steps=3",
            *overrides,
        ],
    )


def typical(run_dir: Path, key: str) -> float:
    values = json.loads((run_dir / "metrics.json").read_text())[key]["value"]
    return median(values)


def fit(tmp_path: Path, callbacks: list[Any], model: pl.LightningModule | None = None, **options: Any) -> Path:
    train, val = options.pop("loaders", None) or loaders(n_train=16 * 30)
    trainer(callbacks, max_steps=options.pop("max_steps", 30), **options).fit(model or TinyRegressor(), train, val)
    (run_dir,) = run_folders(tmp_path / "runs")
    return run_dir


class BusyAtBatchEnd(pl.Callback):
    """A user's callback doing 25 ms of work after every batch (image logging, EMA, metrics)."""

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(BUSY_S)


def test_a_busy_callback_after_ours_is_its_own_figure_not_data_wait(tmp_path: Path) -> None:
    run_dir = fit(tmp_path, [*build_callbacks(fast_config(tmp_path)), BusyAtBatchEnd()])

    assert typical(run_dir, names.TRAIN_DATALOADER_WAIT_MS) < 3.0
    assert typical(run_dir, names.TRAIN_CALLBACKS_MS) == pytest.approx(BUSY_S * 1000, rel=0.3)
    verdicts = {verdict.name: verdict for verdict in diagnose(load_run(run_dir))}
    assert "dataloader-bound" not in verdicts
    assert "BusyAtBatchEnd" in verdicts["callback-bound"].value


def test_the_same_callback_before_ours_is_counted_the_same(tmp_path: Path) -> None:
    run_dir = fit(tmp_path, [BusyAtBatchEnd(), *build_callbacks(fast_config(tmp_path))])

    assert typical(run_dir, names.TRAIN_DATALOADER_WAIT_MS) < 3.0
    # Before ours in the list, its batch-end hook runs inside our step: it is step time, not callbacks or data.
    assert typical(run_dir, names.TRAIN_CALLBACKS_MS) < 3.0
    assert typical(run_dir, names.TRAIN_STEP_MS) > BUSY_S * 1000


class SlowDataset(Dataset):
    def __init__(self, size: int) -> None:
        self.data = torch.randn(size, 8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index % 16 == 0:  # once per batch of 16
            time.sleep(SLOW_FETCH_S)
        x = self.data[index]
        return x, x.sum().reshape(1)


def test_a_slow_dataloader_is_still_dataloader_bound(tmp_path: Path) -> None:
    train = DataLoader(SlowDataset(16 * 30), batch_size=16)
    run_dir = fit(tmp_path, build_callbacks(fast_config(tmp_path)), loaders=(train, None))

    assert typical(run_dir, names.TRAIN_DATALOADER_WAIT_MS) == pytest.approx(SLOW_FETCH_S * 1000, rel=0.3)
    assert typical(run_dir, names.TRAIN_CALLBACKS_MS) < 3.0
    assert "dataloader-bound" in {verdict.name for verdict in diagnose(load_run(run_dir))}


class WideRegressor(TinyRegressor):
    """About 4M parameters (16 MB): a checkpoint save takes milliseconds, a training step much less."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 2000), nn.ReLU(), nn.Linear(2000, 2000), nn.ReLU(), nn.Linear(2000, 1))


def test_a_checkpoint_every_step_is_callback_time_never_data_wait(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=1, save_top_k=-1)
    run_dir = fit(
        tmp_path,
        [*build_callbacks(fast_config(tmp_path)), checkpoint],
        WideRegressor(),
        max_steps=20,
        enable_checkpointing=True,
    )

    callbacks_ms = typical(run_dir, names.TRAIN_CALLBACKS_MS)
    assert typical(run_dir, names.TRAIN_DATALOADER_WAIT_MS) < 0.2 * callbacks_ms
    section = json.loads((run_dir / "report.json").read_text())["sections"]["Step time and memory"]["data"]
    assert section["other callbacks between steps (sampled)"].startswith("ModelCheckpoint")


class IteratorModel(TinyRegressor):
    """A `dataloader_iter` training step: it fetches its own batch, inside the step."""

    def training_step(self, dataloader_iter: Any) -> torch.Tensor:
        (x, y), _, _ = next(dataloader_iter)
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss, batch_size=len(x))
        return loss


def test_a_dataloader_iter_step_still_has_its_fetch_timed(tmp_path: Path) -> None:
    train = DataLoader(SlowDataset(16 * 30), batch_size=16)
    with pytest.warns(UserWarning, match="`dataloader_iter` argument"):  # Lightning: the flavor is experimental
        run_dir = fit(tmp_path, build_callbacks(fast_config(tmp_path)), IteratorModel(), loaders=(train, None))

    assert typical(run_dir, names.TRAIN_DATALOADER_WAIT_MS) == pytest.approx(SLOW_FETCH_S * 1000, rel=0.3)


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        for _ in range(16 * 40):
            x = torch.randn(8)
            yield x, x.sum().reshape(1)


class TwoLoaderModel(TinyRegressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch["a"], batch_idx) + super().training_step(batch["b"], batch_idx)


def test_iterable_datasets_and_two_dataloaders_are_timed_with_validation(tmp_path: Path) -> None:
    combined = CombinedLoader(
        {"a": DataLoader(Stream(), batch_size=16), "b": DataLoader(SlowDataset(16 * 40), batch_size=16)}, "min_size"
    )
    val = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)
    callbacks = build_callbacks(fast_config(tmp_path))
    run_dir = fit(tmp_path, callbacks, TwoLoaderModel(), loaders=(combined, val), val_check_interval=20)

    assert typical(run_dir, names.TRAIN_DATALOADER_WAIT_MS) == pytest.approx(SLOW_FETCH_S * 1000, rel=0.3)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert {names.VAL_DATALOADER_WAIT_MS, names.VAL_CALLBACKS_MS, names.VAL_LOOP_MS} <= set(metrics)


def test_the_users_lightning_profiler_still_profiles_and_is_given_back(tmp_path: Path) -> None:
    profiler = SimpleProfiler(dirpath=tmp_path, filename="simple")
    train, val = loaders(n_train=16 * 20)
    fit_trainer = trainer(build_callbacks(fast_config(tmp_path)), max_steps=20, profiler=profiler)
    fit_trainer.fit(TinyRegressor(), train, val)

    assert fit_trainer.profiler is profiler
    assert not isinstance(fit_trainer.profiler, LoopTimer)
    assert any("train_dataloader_next" in action for action in profiler.recorded_durations)
    assert not [callback for callback in fit_trainer.callbacks if type(callback).__name__ == "StageClockCallback"]


class SlowFirstSample(Dataset):
    """Its first sample takes 0.3 s (a file opened on first use): the first fetch of every validation run."""

    def __init__(self, size: int) -> None:
        self.data = torch.randn(size, 8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == 0:
            time.sleep(0.3)
        x = self.data[index]
        return x, x.sum().reshape(1)


def test_a_validation_runs_first_fetch_is_no_steps_data_wait(tmp_path: Path) -> None:
    """Validation's clock starts at its first batch, after that batch's fetch: the fetch is in no step, so it is in
    no step's data wait either (it read 266 ms of wait against 223 ms steps)."""
    train, _ = loaders(n_train=16 * 20)
    val = DataLoader(SlowFirstSample(16 * 3), batch_size=16)
    run_dir = fit(tmp_path, build_callbacks(fast_config(tmp_path)), loaders=(train, val), max_steps=20)

    metrics = json.loads((run_dir / "metrics.json").read_text())
    wait_ms = metrics[names.summary_of(names.timing("val", "dataloader_wait_ms"))]["value"][-1]
    step_ms = metrics[names.summary_of(names.VAL_STEP_MS)]["value"][-1]
    assert wait_ms <= step_ms and wait_ms < 100


def test_other_callbacks_are_named_by_class_and_no_workers_keep_nothing(tmp_path: Path) -> None:
    """The row names a callback by its class, not by Lightning's state key (`ModelCheckpoint{'monitor': None, ...}`);
    a DataLoader without workers has no `persistent_workers` figure (it read True: all() of nothing)."""
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=1)
    train, _ = loaders(n_train=16 * 10)
    run_dir = fit(
        tmp_path,
        [*build_callbacks(fast_config(tmp_path)), checkpoints],
        loaders=(train, None),
        max_steps=30,
        max_epochs=3,
        enable_checkpointing=True,
    )
    report = json.loads((run_dir / "report.json").read_text())["sections"]
    row = report["Step time and memory"]["data"]["other callbacks between steps (sampled)"]
    assert row.startswith("ModelCheckpoint ") and "{" not in row
    throughput = report["Throughput"]["data"]
    assert throughput["train/dataloader_workers"] == 0 and "train/persistent_workers" not in throughput
