"""A 2-rank gloo DDP fit in which one rank is held in its training step:
`python stalling_job.py <output_dir> <held_rank> <held_at_step> <held_s> [key=value ...]`.

Lightning's launcher starts rank 1 by running this script again. The other rank waits for the held one in the
gradient all-reduce; after `held_s` the held rank goes on and the fit finishes normally.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch

from anemoi_profiler import ProfilerConfig, build_callbacks
from tests.helpers.lightning_models import TinyRegressor, loaders


def job_config(output_dir: str, overrides: tuple[str, ...]) -> ProfilerConfig:
    """The post-mortem jobs' profiler: intervals of 4 steps, no system sampler, no console report."""
    return ProfilerConfig.load(
        None,
        [
            f"output_dir={output_dir}",
            "log_every_n_steps=4",
            "throughput.warmup_steps=2",
            "system.enabled=false",
            "report.console=false",
            *overrides,
        ],
    )


def held_here(seconds: float) -> None:
    time.sleep(seconds)


class HeldRank(TinyRegressor):
    def __init__(self, held_rank: int, held_at_step: int, held_s: float) -> None:
        super().__init__()
        self.held_rank, self.held_at_step, self.held_s = held_rank, held_at_step, held_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.held_rank and self.global_step == self.held_at_step:
            held_here(self.held_s)
        return super().training_step(batch, batch_idx)


def main(output_dir: str, held_rank: str, held_at_step: str, held_s: str, *overrides: str) -> None:
    config = job_config(output_dir, overrides)
    train, _ = loaders(n_train=16 * 24)
    trainer = pl.Trainer(
        callbacks=build_callbacks(config),
        logger=False,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=12,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(HeldRank(int(held_rank), int(held_at_step), float(held_s)), train)
    print(f"rank {trainer.global_rank}: fit returned after {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
