"""A Hydra application with the profiler under `diagnostics.profiler`, as anemoi lays out its configuration.

    python train.py                                                    # the simple preset
    python train.py profiler=detailed diagnostics.profiler.log_every_n_steps=10
    python train.py diagnostics.profiler.tracking.enabled=false paths.output=/tmp/run

`register_hydra_configs()` puts the profiler's schema and presets into Hydra's ConfigStore as the config
group `profiler`, placed at `diagnostics.profiler`: a misspelt profiler key fails when Hydra composes the
tree, before anything trains. `ProfilerConfig.load` takes the section as Hydra hands it over, with its
interpolations (`${paths.output}`) resolved against the whole tree.
"""

from __future__ import annotations

import hydra
import lightning.pytorch as pl
import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.config import register_hydra_configs

register_hydra_configs()  # before @hydra.main composes the tree


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    profiler = ProfilerConfig.load(cfg.diagnostics.profiler)
    x = torch.randn(2048, 16)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=cfg.training.batch_size)
    trainer = pl.Trainer(
        max_steps=cfg.training.max_steps,
        callbacks=build_callbacks(profiler),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regressor(), data)


if __name__ == "__main__":
    main()
