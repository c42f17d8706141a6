"""`AnemoiProfiler`: the whole set from one callback entry, with anemoi's batch layout, on a real CPU fit.

The same class inside the real anemoi-training trainer is checked by `make anemoi-e2e` (ci/anemoi/).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from anemoi_profiler import SystemMetricsCallback, ThroughputCallback
from anemoi_profiler.config import ConfigError
from anemoi_profiler.integrations.anemoi import AnemoiProfiler, grid_points_counter, model_inputs
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import trainer

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


FULL_GRID, SHARD = 40, 10


class ShardedGridSamples(Dataset):
    """anemoi's sample layout (time, ensemble, grid, variables) for dataset "data", holding a shard of the grid."""

    def __len__(self) -> int:
        return 36

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"data": torch.full((2, 1, SHARD, 3), float(index % 5))}


class GridModule(pl.LightningModule):
    """Like anemoi's module: the full grid size of each dataset in `grid_sizes`, dict batches."""

    def __init__(self) -> None:
        super().__init__()
        self.grid_sizes = {"data": FULL_GRID}
        self.net = nn.Linear(3, 3)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x = batch["data"]
        return nn.functional.mse_loss(self.net(x[:, 0]), x[:, 1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def profiler_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "output_dir": str(tmp_path),
        "log_every_n_steps": 4,
        "tracking": {"enabled": False},
        "report": {"console": False},
        "throughput": {"warmup_steps": 2},
        "system": {"interval_s": 0.5},
    }


def test_one_entry_brings_the_whole_set_and_counts_full_grids(tmp_path: Path) -> None:
    entry = AnemoiProfiler(preset="simple", config=profiler_config(tmp_path), overrides=["timing.enabled=false"])
    fit = trainer([entry], max_epochs=2)
    fit.fit(GridModule(), DataLoader(ShardedGridSamples(), batch_size=3))

    members = [type(callback) for callback in fit.callbacks[fit.callbacks.index(entry) + 1 :]]
    assert members[:2] == [ThroughputCallback, SystemMetricsCallback]  # the preset's set, timing overridden off
    (folder,) = run_folders(tmp_path)
    run = load_run(folder)
    # Every batch holds 3 samples of a 10-point shard of a 40-point grid: 40 grid points a sample, not 10.
    assert run.summary("train/items_per_sec") == pytest.approx(run.summary("train/samples_per_sec") * FULL_GRID)


def test_grid_points_without_grid_sizes_come_from_the_grid_dimension() -> None:
    count = grid_points_counter(nn.Linear(1, 1))
    assert count({"era5": torch.zeros(2, 3, 1, 7, 4), "cerra": torch.zeros(2, 3, 1, 5, 4)}) == 2 * 7 + 2 * 5
    assert count(torch.zeros(4, 3, 1, 9, 4)) == 4 * 9


@pytest.mark.parametrize(
    ("arguments", "named"),
    [({"preset": "fast"}, "preset 'fast'"), ({"config": {"throughput": {"warmupsteps": 3}}}, "warmupsteps")],
)
def test_a_wrong_key_fails_when_anemoi_builds_the_callbacks(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        AnemoiProfiler(**arguments)


def test_the_summary_gets_anemoi_s_step_inputs_except_in_a_model_group() -> None:
    class Task:  # anemoi's `task.get_inputs`: the input time steps of the batch (here the first two)
        def get_inputs(self, batch: dict[str, torch.Tensor], data_indices: Any) -> dict[str, torch.Tensor]:
            return {name: tensor[:, :2] for name, tensor in batch.items()}

    module = SimpleNamespace(task=Task(), data_indices=None, model_comm_group_size=1)
    (inputs,) = model_inputs(module)({"data": torch.zeros(2, 3, 1, 5, 4)})
    assert inputs["data"].shape == (2, 2, 1, 5, 4)
    module.model_comm_group_size = 2  # a forward on rank 0 alone would wait for the group's other rank
    with pytest.raises(RuntimeError, match="model group"):
        model_inputs(module)({"data": torch.zeros(2, 3, 1, 5, 4)})
