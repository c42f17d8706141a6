"""Model summary: torchinfo on a real batch with the model left bit-identical, and a static fallback that says why."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import mlflow
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchinfo import torchinfo as torchinfo_module

from anemoi_profiler import wait_for_mlflow
from anemoi_profiler.callbacks.model_summary import (
    ModelSummaryCallback,
    candidate_calls,
    forward_collectives_reason,
    summarize_model,
)
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.distributed.parallelism import detect_parallelism
from anemoi_profiler.trainer.trainer_info import sharding_strategy

FEATURES = 6
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOTAL_PARAMS, TRAINABLE_PARAMS = 153, 81
# torchinfo counts one multiply-add per parameter and sample for Linear and BatchNorm: 153 x batch of 8.
MULT_ADDS = 153 * 8


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


class TinyModel(pl.LightningModule):
    """Dropout, BatchNorm, noise from the RNG, a frozen submodule kept in eval mode: all that a summary may disturb."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.dropout = nn.Dropout(0.5)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(self.frozen(self.backbone(x)))
        return self.head(hidden + 0.01 * torch.randn_like(hidden))

    def on_fit_start(self) -> None:
        self.frozen.eval()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class MultiInputModel(TinyModel):
    """forward(a, b) on batches (a, b, target)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return super().forward(a + b)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        a, b, y = batch
        return nn.functional.mse_loss(self(a, b), y)


class DictInputModel(TinyModel):
    """forward(x, mask) on dict batches {'x', 'mask', 'target'}."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return super().forward(x * mask)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch["x"], batch["mask"]), batch["target"])


class WholeDictModel(TinyModel):
    """forward(batch) taking the whole dict."""

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(batch["inputs"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch), batch["target"])


class NoForwardModel(TinyModel):
    """Calls its layers in training_step and keeps Lightning's placeholder forward."""

    forward = pl.LightningModule.forward

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.backbone(x)), y)


class DictDataset(Dataset):
    def __init__(self, size: int = 32) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, FEATURES, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "mask": torch.ones(FEATURES), "inputs": self.x[index], "target": self.y[index]}


def tuple_loader(tensors: int = 1) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = [torch.randn(32, FEATURES, generator=generator) for _ in range(tensors)] + [torch.randn(32, 1)]
    return DataLoader(TensorDataset(*data), batch_size=8, shuffle=True)


def config(tmp_path: Path, *overrides: str) -> ProfilerConfig:
    base = [f"output_dir={tmp_path}", "system.enabled=false", "report.console=false", "tracking.enabled=false"]
    return ProfilerConfig.load(None, [*base, *overrides])


def fit(
    model: pl.LightningModule, loader: DataLoader, callbacks: list[Any], steps: int = 4, **trainer_options: Any
) -> None:
    trainer = pl.Trainer(
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **{"accelerator": "cpu", **trainer_options},
    )
    trainer.fit(model, loader)


def model_state(model: nn.Module) -> dict[str, Any]:
    """Everything a summary must not change, as comparable values."""
    return {
        "tensors": {name: value.detach().clone() for name, value in model.state_dict(keep_vars=True).items()},
        "dtypes": {name: p.dtype for name, p in model.named_parameters()},
        "devices": {name: p.device for name, p in model.named_parameters()},
        "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
        "grads": {name: p.grad for name, p in model.named_parameters()},
        "modes": {name: module.training for name, module in model.named_modules()},
        "hooks": {
            name: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for name, m in model.named_modules()
        },
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.empty(0),
        "grad_enabled": torch.is_grad_enabled(),
    }


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before["tensors"].keys() == after["tensors"].keys()
    for name, tensor in before["tensors"].items():
        assert torch.equal(tensor, after["tensors"][name]), name
    for key in ("dtypes", "devices", "requires_grad", "modes", "hooks", "grad_enabled"):
        assert before[key] == after[key], key
    assert all(grad is None for grad in after["grads"].values())
    assert torch.equal(before["rng"], after["rng"])
    assert torch.equal(before["cuda_rng"], after["cuda_rng"])


def find_summary_file(tmp_path: Path) -> Path:
    (path,) = tmp_path.glob("*/model_summary.txt")
    return path


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_summary_leaves_the_model_bit_identical(device: str) -> None:
    model = TinyModel().to(device)
    model.train()
    model.frozen.eval()  # mixed modes: torchinfo alone would leave every submodule in the root's mode
    model.backbone(torch.randn(4, FEATURES, device=device))  # move BatchNorm's running stats from their start
    batch = (torch.randn(8, FEATURES, device=device), torch.randn(8, 1, device=device))
    before = model_state(model)

    summary = summarize_model(model, batch, depth=2)

    assert_same_state(before, model_state(model))
    assert summary.static_reason is None
    assert summary.call == "forward(float32[8, 6])"
    assert summary.total_params == sum(p.numel() for p in model.parameters())
    assert summary.trainable_params == summary.total_params - 72  # the frozen 8x8 linear and its bias
    assert summary.mult_adds == MULT_ADDS
    assert "mult-adds 1,224 per forward" in summary.text and "BatchNorm1d (norm)" in summary.text
    assert "TinyModel" not in torchinfo_module._cached_forward_pass  # torchinfo's cache would keep the model alive


@pytest.mark.parametrize(
    "trainer_options",
    [{}, pytest.param({"accelerator": "cuda", "devices": 1, "precision": "bf16-mixed"}, marks=needs_cuda)],
)
def test_fit_with_summary_trains_exactly_like_a_fit_without(tmp_path: Path, trainer_options: dict[str, Any]) -> None:
    """Dropout and noise draw from the RNG and BatchNorm updates buffers: any leak would change the weights."""
    results = []
    for callbacks in ([], [ModelSummaryCallback(config(tmp_path))]):
        pl.seed_everything(7)
        model = TinyModel()
        fit(model, tuple_loader(), callbacks, **trainer_options)
        results.append(copy.deepcopy(model.state_dict()))
    for name, tensor in results[0].items():
        assert torch.equal(tensor, results[1][name]), name
    text = find_summary_file(tmp_path).read_text()
    assert "called as forward(float32[8, 6]) (the first 1 of 2 batch elements)" in text
    assert f"Total params: {TOTAL_PARAMS}" in text


def test_multi_tensor_batches_call_forward_with_the_leading_elements(tmp_path: Path) -> None:
    callback = ModelSummaryCallback(config(tmp_path))
    fit(MultiInputModel(), tuple_loader(tensors=2), [callback], steps=2)
    assert callback.result is not None and callback.result.static_reason is None
    assert callback.result.call == "forward(float32[8, 6], float32[8, 6])"
    assert callback.result.mult_adds == MULT_ADDS


@pytest.mark.parametrize(
    ("model_class", "expected_call"),
    [
        (DictInputModel, "forward(x=float32[8, 6], mask=float32[8, 6])"),
        (WholeDictModel, "forward({'x': float32[8, 6], 'mask': float32[8, 6], 'inputs': float32[8, 6], "),
    ],
)
def test_dict_batches(tmp_path: Path, model_class: type[TinyModel], expected_call: str) -> None:
    callback = ModelSummaryCallback(config(tmp_path))
    fit(model_class(), DataLoader(DictDataset(), batch_size=8), [callback], steps=2)
    assert callback.result is not None and callback.result.static_reason is None
    assert callback.result.call.startswith(expected_call)


def test_input_fn_chooses_the_call() -> None:
    model = MultiInputModel()
    batch = {"a": torch.randn(4, FEATURES), "b": torch.randn(4, FEATURES)}
    summary = summarize_model(model, batch, input_fn=lambda b: (b["a"], b["b"]))
    assert summary.call == "forward(float32[4, 6], float32[4, 6])"
    summary = summarize_model(model, batch, input_fn=lambda b: {"a": b["a"], "b": b["b"]})
    assert summary.call == "forward(a=float32[4, 6], b=float32[4, 6])"


def test_candidate_calls_follow_the_documented_rule() -> None:
    x, y = torch.randn(2, FEATURES), torch.randn(2, 1)
    calls = candidate_calls(TinyModel(), [x, y])
    assert [c.rule for c in calls] == ["the first 1 of 2 batch elements", "the whole batch"]
    assert calls[0].args[0] is x
    assert [c.rule for c in candidate_calls(MultiInputModel(), (x, x, y))] == ["the first 2 of 3 batch elements"]
    assert [c.rule for c in candidate_calls(TinyModel(), x)] == ["the whole batch"]


def test_forward_failure_falls_back_to_the_static_summary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Wrong inputs (forward fails on the leading element and on the whole batch): a warning, training goes on."""
    model = MultiInputModel()
    batch = {"a": torch.randn(2, 3)}
    before = model_state(model)
    with caplog.at_level(logging.WARNING):
        summary = summarize_model(model, batch, input_fn=lambda b: (b["a"], b["a"]))
    assert_same_state(before, model_state(model))
    assert summary.static_reason is not None and "RuntimeError" in summary.static_reason
    assert summary.mult_adds is None and summary.total_params == TOTAL_PARAMS
    assert "backbone  Backbone" in summary.text and "why:" in summary.text
    assert "model summary without a forward pass" in caplog.text


def test_model_without_forward_gets_the_static_summary_and_still_trains(tmp_path: Path) -> None:
    callback = ModelSummaryCallback(config(tmp_path))
    fit(NoForwardModel(), tuple_loader(), [callback], steps=2)
    text = find_summary_file(tmp_path).read_text()
    assert "static (no forward pass)" in text
    assert "NoForwardModel does not define forward()" in text
    assert callback.result is not None and callback.result.params() == {
        "model/total_params": TOTAL_PARAMS,
        "model/trainable_params": TRAINABLE_PARAMS,
    }


def test_sharded_strategies_are_not_run() -> None:
    fsdp = SimpleNamespace(strategy=type("FSDPStrategy", (), {})())
    assert sharding_strategy(fsdp) == "FSDPStrategy"
    assert sharding_strategy(SimpleNamespace(strategy=type("DDPStrategy", (), {})())) is None
    summary = ModelSummaryCallback(ProfilerConfig())._summary_on_batch(fsdp, TinyModel(), torch.randn(2, FEATURES))
    assert summary.static_reason is not None and "shards the model" in summary.static_reason


class DDPGroupStrategy(DDPStrategy):
    """anemoi's strategy as the profiler sees it: plain DDP plus a model communication group size."""

    def __init__(self, model_comm_group_size: int) -> None:
        super().__init__()
        self.model_comm_group_size = model_comm_group_size


class CustomStrategy(DDPStrategy):
    pass


@pytest.mark.parametrize(
    ("strategy", "reason"),
    [
        (DDPStrategy(), None),
        (DDPGroupStrategy(model_comm_group_size=1), None),
        (
            DDPGroupStrategy(model_comm_group_size=2),
            "2 ranks work on each sample (DDPGroupStrategy.model_comm_group_size=2)",
        ),
        (CustomStrategy(), "CustomStrategy may run collectives in forward"),
        (ModelParallelStrategy(), "ModelParallelStrategy shards the model"),
    ],
)
def test_a_forward_on_rank_zero_alone_is_run_only_where_it_exchanges_nothing(strategy: Any, reason: str | None) -> None:
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False, enable_progress_bar=False)
    parallelism = detect_parallelism(trainer.strategy, trainer.world_size, "auto")
    found = forward_collectives_reason(trainer, parallelism)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


def test_params_and_file_land_in_a_real_mlflow_run(tmp_path: Path) -> None:
    cfg = ProfilerConfig.load(None, [f"output_dir={tmp_path}", "system.enabled=false", "report.console=false"])
    fit(TinyModel(), tuple_loader(), [ModelSummaryCallback(cfg)], steps=2)
    wait_for_mlflow()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.data.params["model/total_params"] == str(TOTAL_PARAMS)
    assert run.data.params["model/trainable_params"] == str(TRAINABLE_PARAMS)
    assert run.data.params["model/mult_adds"] == str(MULT_ADDS)
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "profiler")]
    assert "profiler/model_summary.txt" in artifacts
    report = (find_summary_file(tmp_path).parent / "report.txt").read_text()
    assert "Model summary" in report and "mult-adds per forward" in report
