"""The action names of `run/lightning_actions.py` are Lightning internals: a real fit of each installed Lightning
namespace must still call every one of them, or this fails (and the figures they feed would go missing)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler.run import lightning_actions
from tests.helpers.lightning_models import TinyRegressor

EXPECTED = [*lightning_actions.FETCH_ACTIONS, lightning_actions.TRAINING_STEP]


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_real_fit_calls_every_action_the_loop_timer_listens_for(namespace: str) -> None:
    pl = pytest.importorskip(namespace)
    profilers = importlib.import_module(f"{namespace}.profilers")
    seen: set[str] = set()

    class Recording(profilers.PassThroughProfiler):
        def start(self, action_name: str) -> None:
            seen.add(action_name)

    class OneHook(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            pass

    x = torch.randn(32, 8)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    model = TinyRegressor() if namespace == "lightning.pytorch" else _legacy_module(pl)
    trainer = pl.Trainer(
        max_steps=3,
        limit_val_batches=1,
        val_check_interval=2,
        num_sanity_val_steps=0,
        profiler=Recording(),
        callbacks=[OneHook()],
        logger=False,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data, data)

    assert [action for action in EXPECTED if action not in seen] == []
    hooks = [action for action in seen if action.startswith(lightning_actions.CALLBACK_PREFIX)]
    assert any("OneHook" in action and action.endswith(".on_train_batch_end") for action in hooks), hooks


def _legacy_module(pl: Any) -> Any:
    """TinyRegressor's training and validation steps on a `pytorch_lightning.LightningModule`."""

    class Legacy(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.training_step(batch, batch_idx)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Legacy()
