"""A one-process fit whose training step, at one step, calls C code that keeps the interpreter lock:
`python wedged_job.py <output_dir> <wedged_at_step> <wedged_s> [key=value ...]`.

`sleep` of the C library called through `ctypes.PyDLL` keeps the GIL, as an extension that never releases it
does: no Python thread of the process runs meanwhile, the stall watchdog's included. The step first spends
`PYTHON_S` in Python, as a real step does: the watchdog, which wakes once a second, sees its step before the
wedge (what a wedged process's record says is what the watchdog saw last).
"""

from __future__ import annotations

import ctypes
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch

from anemoi_profiler import build_callbacks
from tests.helpers.lightning_models import TinyRegressor, loaders
from tests.system.postmortem.stalling_job import job_config

PYTHON_S = 1.5


def wedged_here(seconds: int) -> None:
    ctypes.PyDLL(None).sleep(seconds)


class WedgedStep(TinyRegressor):
    def __init__(self, wedged_at_step: int, wedged_s: int) -> None:
        super().__init__()
        self.wedged_at_step, self.wedged_s = wedged_at_step, wedged_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.wedged_at_step:
            time.sleep(PYTHON_S)
            print(f"wedged at step {self.global_step}", flush=True)
            wedged_here(self.wedged_s)
        return super().training_step(batch, batch_idx)


def main(output_dir: str, wedged_at_step: str, wedged_s: str, *overrides: str) -> None:
    config = job_config(output_dir, overrides)
    train, _ = loaders(n_train=16 * 16)
    trainer = pl.Trainer(
        callbacks=build_callbacks(config),
        logger=False,
        accelerator="cpu",
        devices=1,
        max_steps=int(wedged_at_step) + 4,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(WedgedStep(int(wedged_at_step), int(wedged_s)), train)
    print(f"fit returned after {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
