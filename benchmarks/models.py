"""The models, data and Trainer settings that every benchmark configuration shares.

CPU: an MLP sized to a 20 ms training step (`cpu-20ms`, the always-on overhead's model: a realistic step on
one core), smaller ones for short runs (`cpu`, about 1 ms) and the quick mode (`tiny`).
CUDA: the H200 baseline model of tests/fixtures/README.md (read off its trace): an 8-layer pre-norm
transformer encoder, d=1024, 16 heads, vocabulary 8192, batch 16 x 512 tokens, AdamW, bf16-mixed.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import Logger
except ImportError:  # pragma: no cover - only pytorch_lightning installed
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import Logger


@dataclass(frozen=True)
class ModelSpec:
    """What to train: `kind` is "mlp" (float features, MSE) or "transformer" (tokens, cross-entropy)."""

    name: str
    kind: str
    width: int
    layers: int
    batch_size: int
    seq_len: int = 0
    vocab: int = 0
    heads: int = 0
    precision: str = "32-true"
    num_workers: int = 0

    def describe(self) -> str:
        if self.kind == "mlp":
            return f"MLP {self.layers}x{self.width}, batch {self.batch_size}, {self.precision}"
        return (
            f"transformer {self.layers} layers d={self.width} heads={self.heads} vocab={self.vocab}, "
            f"batch {self.batch_size}x{self.seq_len} tokens, {self.precision}"
        )


MLP_FEATURES = 64
SPECS = {
    "cpu": ModelSpec("cpu", "mlp", width=256, layers=4, batch_size=64),
    "tiny": ModelSpec("tiny", "mlp", width=32, layers=2, batch_size=16),
    "cpu-5ms": ModelSpec("cpu-5ms", "mlp", width=512, layers=4, batch_size=128),
    "cpu-20ms": ModelSpec("cpu-20ms", "mlp", width=1024, layers=4, batch_size=160),  # 4x the 5 ms model's work
    "cpu-50ms": ModelSpec("cpu-50ms", "mlp", width=1024, layers=4, batch_size=384),  # 10x the 5 ms model's work
    "h200": ModelSpec(
        "h200",
        "transformer",
        width=1024,
        layers=8,
        batch_size=16,
        seq_len=512,
        vocab=8192,
        heads=16,
        precision="bf16-mixed",
        num_workers=2,
    ),
}


class MlpRegressor(pl.LightningModule):
    """A plain MLP regressing one value; SGD, no logging, so the step is model work plus Lightning."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Linear(MLP_FEATURES, width), nn.ReLU()]
        for _ in range(layers - 2):
            blocks += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*blocks, nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class BaselineTransformer(pl.LightningModule):
    """The H200 baseline model: embedding, pre-norm transformer encoder, vocabulary head, next-token loss."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(tokens)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        logits = self(tokens)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class NullLogger(Logger):
    """A logger that keeps nothing: callbacks that need one (DeviceStatsMonitor) get it, at no cost."""

    @property
    def name(self) -> str:
        return "null"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def make_model(spec: ModelSpec, device: str = "cpu") -> pl.LightningModule:
    """A freshly initialised model (same seed every time), built on `device` (fast on a GPU)."""
    torch.manual_seed(0)
    with torch.device(device):
        if spec.kind == "mlp":
            return MlpRegressor(spec.width, spec.layers)
        return BaselineTransformer(spec.vocab, spec.width, spec.layers, spec.heads)


def make_loader(spec: ModelSpec, batches: int) -> DataLoader:
    """`batches` batches of random data, generated once on the host (like a fast dataloader)."""
    generator = torch.Generator().manual_seed(0)
    rows = batches * spec.batch_size
    if spec.kind == "mlp":
        x = torch.randn(rows, MLP_FEATURES, generator=generator)
        dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    else:
        tokens = torch.randint(0, spec.vocab, (rows, spec.seq_len + 1), generator=generator)
        dataset = TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    return DataLoader(
        dataset,
        batch_size=spec.batch_size,
        num_workers=spec.num_workers,
        pin_memory=spec.num_workers > 0,
        persistent_workers=False,
    )


def samples_in(batch: Any) -> int:
    """batch_size_fn for ThroughputMonitor and ours: dim 0 of the inputs (a shape, so no device sync)."""
    return int(batch[0].shape[0])


def make_trainer(spec: ModelSpec, device: str, steps: int, callbacks: list[Any], **options: Any) -> pl.Trainer:
    """A Trainer that does training steps only: no validation, checkpoints, progress bar or summary."""
    settings: dict[str, Any] = {
        "accelerator": device,
        "devices": 1,
        "precision": spec.precision,
        "max_steps": steps,
        "max_epochs": 1,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "logger": NullLogger(),
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": callbacks,
        **options,
    }
    return pl.Trainer(**settings)


def quiet_lightning() -> None:
    """Keep Lightning's banners and hints out of the benchmark output."""
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*The number of training batches.*")
    warnings.filterwarnings("ignore", message=".*you need to define a `flops_per_batch`.*")
