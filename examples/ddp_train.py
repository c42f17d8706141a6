"""Profile a DDP training with anemoi-profiler: copy this file and put your model and data in place of the toy ones.

    python examples/ddp_train.py                                  # Lightning starts 2 CPU processes itself
    torchrun --nproc_per_node 2 examples/ddp_train.py             # or torchrun starts them
    python examples/ddp_train.py --preset detailed --output-dir runs throughput.warmup_steps=5

Everything goes below --output-dir (default `profiler_runs`): one run folder for the whole job (`report.txt`,
`report.json`, traces with `--preset detailed`) and the MLflow store `mlflow.db`, which
`mlflow ui --backend-store-uri sqlite:///profiler_runs/mlflow.db` shows. `key=value` arguments override the
profiler's config (docs/configuration.md). On GPUs, set `accelerator="gpu"`; the callbacks stay the same.
"""

from __future__ import annotations

import argparse
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.tracking import artifact_location_for, resolve_tracking_uri


class Regressor(pl.LightningModule):
    def __init__(self, features: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def is_global_rank_zero() -> bool:
    """Read from the launcher's environment, before the Trainer exists (torchrun and SLURM set RANK/SLURM_PROCID;
    Lightning's launcher runs this script as local rank 0 of its node)."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return int(os.environ.get("NODE_RANK", 0)) == 0 and int(os.environ.get("LOCAL_RANK", 0)) == 0


def mlflow_logger(config: ProfilerConfig) -> MLFlowLogger | bool:
    """An MLFlowLogger on the profiler's store, which the profiler then writes into. Rank 0 only: under torchrun
    all ranks would create a new sqlite store's tables at once and all but one fail (docs/distributed.md)."""
    if not is_global_rank_zero():
        return False
    uri = resolve_tracking_uri(config.tracking.uri, None, config.output_dir)
    return MLFlowLogger(config.tracking.experiment, tracking_uri=uri, artifact_location=artifact_location_for(uri))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["simple", "detailed"], default="simple")
    parser.add_argument("--output-dir", default="profiler_runs")
    parser.add_argument("--devices", type=int, default=2, help="processes per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="profiler config overrides")
    args = parser.parse_args()
    config = ProfilerConfig.load(args.preset, [f"output_dir={args.output_dir}", *args.overrides])

    torch.manual_seed(0)  # the same data on every rank; Lightning's DistributedSampler splits it
    x = torch.randn(2048, 32)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_steps=args.max_steps,
        log_every_n_steps=config.log_every_n_steps,
        callbacks=build_callbacks(config),  # the same callbacks on every rank; they share one run
        logger=mlflow_logger(config),
        enable_checkpointing=False,
    )
    trainer.fit(Regressor(), data)


if __name__ == "__main__":
    main()
