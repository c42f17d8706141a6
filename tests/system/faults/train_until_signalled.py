"""A training job for the signal tests:
`python train_until_signalled.py <output_dir> <ready_file> [--profiled] [--tracking-uri=URI]`.

It trains TinyRegressor for up to 2000 slow batches and touches `ready_file` once 5 batches are done, so that
the test can send it a signal mid-fit, as a scheduler does; it prints how `fit` returned.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from anemoi_profiler import ProfilerConfig, build_callbacks
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


class TouchWhenRunning(pl.Callback):
    def __init__(self, ready_file: Path) -> None:
        self.ready_file = ready_file

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == 5:
            self.ready_file.touch()


def main(output_dir: str, ready_file: str, *flags: str) -> None:
    callbacks: list[Any] = [TouchWhenRunning(Path(ready_file))]
    if "--profiled" in flags:
        tracking = [f"tracking.uri={flag.split('=', 1)[1]}" for flag in flags if flag.startswith("--tracking-uri=")]
        config = ProfilerConfig.load(
            None,
            [
                f"output_dir={output_dir}",
                "log_every_n_steps=2",
                "throughput.warmup_steps=0",
                "system.interval_s=0.5",
                "tracking.flush_interval_s=0.2",
                "report.console=false",
                *tracking,
            ],
        )
        callbacks += build_callbacks(config)
    train, _ = loaders(n_train=16 * 2000)
    fit = trainer(callbacks)
    fit.fit(TinyRegressor(step_sleep_s=0.02), train)
    print(f"fit returned after {fit.global_step} steps, status {fit.state.status.value}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
