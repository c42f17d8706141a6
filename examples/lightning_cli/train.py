"""LightningCLI with the profiler's callbacks in YAML (`class_path` / `init_args`), no profiler code here.

    python examples/lightning_cli/train.py fit --config examples/lightning_cli/config.yaml
    python examples/lightning_cli/train.py fit --config examples/lightning_cli/config.yaml --trainer.max_steps=300
    python examples/lightning_cli/train.py fit --config examples/lightning_cli/config.yaml --print_config

The callbacks' `config` is a mapping of profiler keys (checked by LightningCLI against ProfilerConfig when it
parses the YAML), a preset name (`simple`, `detailed`) or the path of a profiler YAML file. Callbacks with
equal configs share one run folder and MLflow run (the logger's, when there is an MLFlowLogger).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 64, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class RandomData(pl.LightningDataModule):
    def __init__(self, samples: int = 4096, batch_size: int = 32) -> None:
        super().__init__()
        x = torch.randn(samples, 16, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, x.sum(dim=1, keepdim=True))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=2 * self.batch_size)


class SaveConfigToMLflow(SaveConfigCallback):
    """Keep LightningCLI's resolved config in the MLflow run.

    LightningCLI writes it to the logger's folder, which an MLFlowLogger on a database or server has not
    (Lightning then fails on `assert log_dir is not None`); this puts it among the run's artifacts instead.
    """

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        logger = trainer.logger
        text = self.parser.dump(self.config, skip_none=False)
        logger.experiment.log_text(logger.run_id, text, "lightning_cli/config.yaml")


if __name__ == "__main__":
    LightningCLI(
        Regressor,
        RandomData,
        save_config_callback=SaveConfigToMLflow,
        save_config_kwargs={"save_to_log_dir": False},
    )
