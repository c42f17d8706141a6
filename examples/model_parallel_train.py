"""Train with Lightning's ModelParallelStrategy (FSDP2 and tensor parallelism) and the anemoi-profiler callbacks.

    python examples/model_parallel_train.py --devices 2 --data-parallel 2 --tensor-parallel 1   # FSDP2
    python examples/model_parallel_train.py --devices 2 --data-parallel 1 --tensor-parallel 2   # tensor parallel

`configure_model` shards the MLP with `fully_shard` over the data-parallel mesh dimension and splits its
layers column- and row-wise over the tensor-parallel one. It runs on CPU with gloo (torch >= 2.13,
Lightning >= 2.6), which the tests use; on GPUs pass `--accelerator cuda`. Profiler options go as `key=value`
after the flags, e.g. `distributed.data_parallel_size=1`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks

FEATURES = 32


class ShardedRegressor(pl.LightningModule):
    """A two-layer MLP that `configure_model` parallelizes over the strategy's device mesh."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up = nn.Linear(FEATURES, width)
        self.down = nn.Linear(width, FEATURES)
        self.head = nn.Linear(FEATURES, 1)

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh["tensor_parallel"].size() > 1:
            plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
            parallelize_module(self, mesh["tensor_parallel"], plan)
        if mesh["data_parallel"].size() > 1:
            for layer in (self.up, self.down, self.head):
                fully_shard(layer, mesh=mesh["data_parallel"])
            fully_shard(self, mesh=mesh["data_parallel"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.down(torch.relu(self.up(x)))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def synthetic_data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["simple", "detailed"], default="simple", help="profiler preset")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--data-parallel", type=int, default=2)
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="samples per data-parallel replica and step")
    parser.add_argument("--output-dir", help="profiler output_dir")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="profiler config overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = [*args.overrides, *([f"output_dir={args.output_dir}"] if args.output_dir else [])]
    config = ProfilerConfig.load(args.preset, overrides)
    torch.manual_seed(0)
    samples = args.max_steps * args.batch_size * args.data_parallel
    strategy = ModelParallelStrategy(data_parallel_size=args.data_parallel, tensor_parallel_size=args.tensor_parallel)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        strategy=strategy,
        devices=args.devices,
        max_steps=args.max_steps,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        log_every_n_steps=config.log_every_n_steps,
        callbacks=build_callbacks(config),
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=sys.stdout.isatty(),
    )
    train = DataLoader(synthetic_data(samples, seed=0), args.batch_size)
    val = DataLoader(synthetic_data(4 * args.batch_size * args.data_parallel, seed=1), args.batch_size)
    trainer.fit(ShardedRegressor(), train, val)


if __name__ == "__main__":
    main()
