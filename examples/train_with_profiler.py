"""The smallest complete use: your LightningModule, your MLFlowLogger, the profiler's callbacks.

    python examples/train_with_profiler.py                          # defaults (the simple preset)
    python examples/train_with_profiler.py --config examples/detailed.yaml throughput.warmup_steps=10

Everything lands in the logger's MLflow run (open it with the `mlflow ui` command printed at the end) and in
the run folder, all below `output_dir` (`output_dir=<folder>` to choose it): nothing in the working directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.tracking import artifact_location_for


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="profiler YAML (e.g. examples/detailed.yaml); default: the defaults")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()

    config = ProfilerConfig.load(args.config, args.overrides)
    database = Path(config.output_dir).resolve() / "mlflow.db"
    database.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{database}"
    logger = MLFlowLogger(experiment_name="examples", tracking_uri=uri, artifact_location=artifact_location_for(uri))

    x = torch.randn(4096, 16)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        default_root_dir=config.output_dir,
        callbacks=build_callbacks(config),
        logger=logger,
        log_every_n_steps=config.log_every_n_steps,
        limit_val_batches=4,
        val_check_interval=100,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=32, shuffle=True), DataLoader(data, batch_size=64))


if __name__ == "__main__":
    main()
