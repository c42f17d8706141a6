"""A small bundled model and synthetic data, so `anemoi-profiler demo` shows the whole product in a few minutes."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import MLFlowLogger
except ImportError:  # pragma: no cover
    import pytorch_lightning as pl  # type: ignore[no-redef]  # checked against lightning's
    from pytorch_lightning.loggers import MLFlowLogger  # type: ignore[assignment]

from anemoi_profiler.build import build_callbacks
from anemoi_profiler.config import ConfigError, ProfilerConfig
from anemoi_profiler.tracking.mlflow_target import experiment_id
from anemoi_profiler.tracking.mlflow_versions import sqlite_store_problem
from anemoi_profiler.tracking.uris import artifact_location_for, resolve_tracking_uri


class SyntheticSequences(Dataset):
    """Random token sequences with a learnable target (sum of the first tokens), generated on the fly."""

    def __init__(self, size: int, seq_len: int = 32, vocab: int = 256, delay_s: float = 0.0) -> None:
        self.size, self.seq_len, self.vocab, self.delay_s = size, seq_len, vocab, delay_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        generator = torch.Generator().manual_seed(index)
        tokens = torch.randint(0, self.vocab, (self.seq_len,), generator=generator)
        return tokens, (tokens[:4].float().mean() / self.vocab).reshape(1)


class DemoTransformer(pl.LightningModule):
    """A two-layer transformer encoder regressing one value per sequence."""

    def __init__(self, vocab: int = 256, width: int = 128, layers: int = 2, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens, target = batch
        loss = nn.functional.mse_loss(self(tokens), target)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        tokens, target = batch
        self.log("val/loss", nn.functional.mse_loss(self(tokens), target))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])


PROGRESS_EVERY = 50
"""Training steps between the demo's progress lines when no progress bar shows (output not a terminal)."""


class ProgressLines(pl.Callback):
    """A line every `every` training steps, for an output that is not a terminal (Lightning's bar is off there)."""

    def __init__(self, say: Callable[[str], None], max_steps: int, every: int = PROGRESS_EVERY) -> None:
        self.say, self.max_steps, self.every = say, max_steps, every
        self.started, self.said = time.monotonic(), 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.started = time.monotonic()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step != self.said and (step % self.every == 0 or step == self.max_steps):  # once a step (accumulation)
            self.said = step
            self.say(f"step {step}/{self.max_steps}, {time.monotonic() - self.started:.0f} s")


def tokens_in_batch(batch: Any) -> int:
    """Items for items_per_sec: tokens per batch (a shape product, so no device sync)."""
    return batch[0].numel()


def run_demo(
    config: ProfilerConfig,
    max_steps: int = 400,
    batch_size: int = 32,
    slow_data: bool = False,
    say: Callable[[str], None] | None = None,
) -> Any:
    """Train the demo model with the profiler callbacks and an MLFlowLogger on the same tracking store.

    `say`: told of each phase before it starts and, without a progress bar, of the steps every `PROGRESS_EVERY`
    (the CLI prints it); None: quiet."""
    say = say or (lambda text: None)
    # First, as the README advises: the MLflow sender imports MLflow while the data and the logger are made.
    callbacks = build_callbacks(config, length_fn=tokens_in_batch)
    torch.manual_seed(0)
    train = DataLoader(SyntheticSequences(max_steps * batch_size, delay_s=0.008 if slow_data else 0.0), batch_size)
    val = DataLoader(SyntheticSequences(8 * batch_size), batch_size)
    logger: Any = False
    if config.tracking.enabled:
        try:  # the demo's own MLFlowLogger would fail on it with a traceback from inside MLflow
            Path(config.output_dir).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"output_dir {config.output_dir} cannot be created: {error.strerror or error}") from None
        tracking_uri = resolve_tracking_uri(config.tracking.uri, None, config.output_dir)
        if tracking_uri.startswith("sqlite:") and (problem := sqlite_store_problem()):
            raise ConfigError(problem)
        say(f"opening the MLflow store {tracking_uri} (its first use creates the tables)")
        from mlflow.tracking import MlflowClient

        # Made before the logger does, so that it is made as the profiler's own experiments are (their tags).
        experiment_id(MlflowClient(tracking_uri), tracking_uri, config.tracking.experiment)
        logger = MLFlowLogger(
            experiment_name=config.tracking.experiment,
            tracking_uri=tracking_uri,
            run_name=config.tracking.run_name or "demo",
            artifact_location=artifact_location_for(tracking_uri),
        )
    progress_bar = sys.stdout.isatty()
    trainer = pl.Trainer(
        max_steps=max_steps,
        # as a list of Lightning's `Callback`, the type Trainer asks for
        callbacks=[*callbacks, *([] if progress_bar else [ProgressLines(say, max_steps)])],
        logger=logger,
        accelerator="auto",
        devices=1,
        val_check_interval=min(100, max_steps),
        limit_val_batches=8,
        log_every_n_steps=config.log_every_n_steps,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress_bar,
    )
    say(f"training {max_steps} steps on {trainer.accelerator.__class__.__name__.removesuffix('Accelerator')}")
    trainer.fit(DemoTransformer(), train, val)
    return trainer
