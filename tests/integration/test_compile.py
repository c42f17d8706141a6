"""torch.compile: the profiler adds no graph, recompile or graph break, counts the FLOPs eager code would, and
leaves the compiler as it found it, also when the first step fails.

Real Lightning fits on CPU with inductor, bare and with the default callbacks plus the model summary and
FLOP counting (a user peak, as a GPU's would be), with the model compiled the two ways users do it: a
submodule inside the LightningModule, and the whole LightningModule given to `fit`. Dynamo's counters of
each fit are compared. The sanity check's validation steps run too, so eval-mode graphs are counted as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.flop_counter import FlopCounterMode

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.callbacks.throughput import ThroughputCallback
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


class CompilableRegressor(TinyRegressor):
    """TinyRegressor without `self.log` in its steps: dynamo (torch 2.13) cannot trace Lightning's logging
    when the whole LightningModule is compiled, with or without the profiler."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_at_step is not None and self.global_step >= self.fail_at_step:
            raise RuntimeError("boom from the user's training_step")
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


pytestmark = pytest.mark.slow
BATCH = 16
OVERRIDES = [
    "tracking.enabled=false",
    "report.console=false",
    "report.html=false",
    "model_summary.enabled=true",
    "throughput.device_peak_flops=1e12",
    "throughput.warmup_steps=2",
    "log_every_n_steps=5",
]


def dynamo_counts() -> dict[str, Any]:
    return {
        "frames": dict(counters["frames"]),
        "graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def compiled_model(how: str, fail_at_step: int | None = None) -> Any:
    torch.manual_seed(0)
    model = CompilableRegressor(width=32, fail_at_step=fail_at_step)
    if how == "submodule":
        model.net = torch.compile(model.net)
        return model
    return torch.compile(model)


def fit(how: str, profiled: bool, output: Path, fail_at_step: int | None = None) -> tuple[dict[str, Any], list[Any]]:
    torch._dynamo.reset()
    counters.clear()
    callbacks = build_callbacks(ProfilerConfig.load(None, [f"output_dir={output}", *OVERRIDES])) if profiled else []
    train, val = loaders(n_train=20 * BATCH, batch_size=BATCH)
    run = trainer(callbacks, max_steps=12, num_sanity_val_steps=2, limit_val_batches=2)
    if fail_at_step is None:
        run.fit(compiled_model(how), train, val)
    else:
        with pytest.raises(RuntimeError, match="boom"):
            run.fit(compiled_model(how, fail_at_step), train, val)
    return dynamo_counts(), callbacks


def eager_flops_per_sample() -> float:
    torch.manual_seed(0)
    net = CompilableRegressor(width=32).net
    x, y = next(iter(loaders(n_train=20 * BATCH, batch_size=BATCH)[0]))
    with FlopCounterMode(display=False) as counter:
        nn.functional.mse_loss(net(x), y).backward()
    return counter.get_total_flops() / BATCH


def still_compiles() -> bool:
    """A fresh function compiles: nothing left the compiler set aside (force_eager) after the fit."""
    counters.clear()
    torch.compile(lambda x: x * 2 + 1)(torch.ones(3))
    return counters["frames"]["ok"] >= 1


@pytest.mark.parametrize("how", ["submodule", "whole module"])
def test_the_profiler_adds_no_graph_recompile_or_break_and_counts_eager_flops(how: str, tmp_path: Path) -> None:
    bare, _ = fit(how, profiled=False, output=tmp_path)
    ours, callbacks = fit(how, profiled=True, output=tmp_path)
    assert bare["graphs"] >= 2 and bare["frames"]["ok"] >= 1  # training and eval graphs: the model did compile
    assert ours == bare
    assert still_compiles()

    throughput = next(c for c in callbacks if isinstance(c, ThroughputCallback))
    # the first training step alone, eagerly: not the model summary's extra forward pass that came before it
    assert throughput.flops_per_sample == pytest.approx(eager_flops_per_sample())
    run_dir = throughput.session.run_dir
    assert "torchinfo on the first training batch" in (run_dir / "model_summary.txt").read_text()


def test_a_failing_first_step_leaves_the_compiler_on(tmp_path: Path) -> None:
    fit("submodule", profiled=True, output=tmp_path, fail_at_step=0)
    assert still_compiles()
