"""Tiny real Lightning models and data for fast CPU fits in the tests."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class TinyRegressor(pl.LightningModule):
    """A two-layer MLP; `step_sleep_s` makes each training step take a known minimum time."""

    def __init__(self, width: int = 16, step_sleep_s: float = 0.0, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 1))
        self.step_sleep_s = step_sleep_s
        self.fail_at_step = fail_at_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_at_step is not None and self.global_step >= self.fail_at_step:
            raise RuntimeError("boom from the user's training_step")
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SlowSamples(Dataset):
    """A dataset whose samples take 8 ms each to load, like decoding files on a busy filesystem: a wait that stays
    most of a small model's step even when a loaded machine slows its compute several times."""

    def __init__(self, size: int = 384) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.008)
        return self.x[index], self.x[index].sum(0, keepdim=True)


def loaders(n_train: int = 256, n_val: int = 64, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_val, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    train = TensorDataset(x[:n_train], y[:n_train])
    val = TensorDataset(x[n_train:], y[n_train:])
    return DataLoader(train, batch_size=batch_size), DataLoader(val, batch_size=batch_size)


def trainer(callbacks: list, logger: Any = False, **kwargs: Any) -> pl.Trainer:
    options = {
        "max_epochs": 1,
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
    }
    options.update(kwargs)
    return pl.Trainer(callbacks=callbacks, logger=logger, **options)
