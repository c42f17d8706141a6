"""The snippets a new user copies first, README's "Use it with your Trainer" and docs/index.md's "In your own
training", run as written in an empty folder and write only below the folder they name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names

REPO = Path(__file__).resolve().parents[2]

# The snippets leave the model and its data to the reader: a tiny model whose batches have the "tokens" README's
# length_fn counts, and a Trainer cut to a few steps.
HARNESS = """
import sys
import lightning as L
import torch
from torch.utils.data import DataLoader


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch["tokens"].float()).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader([{"tokens": torch.randn(8)} for _ in range(64)], batch_size=4)


make_model, make_datamodule = Model, Data
"""


SNIPPETS = {
    "README": (REPO / "README.md", r"## Use it with your Trainer.*?```python\n(.*?)```"),
    "docs/index.md": (REPO / "docs" / "index.md", r"In your own training:.*?```python\n(.*?)```"),
}


def snippet(name: str) -> str:
    path, pattern = SNIPPETS[name]
    found = re.search(pattern, path.read_text(), re.DOTALL)
    assert found, f"{path.name} has no Python snippet where {pattern!r} looks"
    return found.group(1)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SNIPPETS))
def test_the_snippet_runs_in_an_empty_folder_and_writes_only_below_its_folder(name: str, tmp_path: Path) -> None:
    code = snippet(name)
    assert "L.Trainer(" in code and "profiler.yaml" not in code  # a preset: no file the user does not have
    code = code.replace("L.Trainer(", "L.Trainer(max_steps=30, enable_progress_bar=False, ")
    script = tmp_path / "snippet.py"
    script.write_text(HARNESS + code)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd, env={**env, "MLFLOW_DISABLE_TELEMETRY": "true"}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]

    assert [path.name for path in cwd.iterdir()] == ["runs"]  # the folder the snippet names, nothing beside it
    client = MlflowClient(f"sqlite:///{cwd / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
    assert names.SUMMARY_TRAIN_SAMPLES_PER_SEC in run.data.metrics
    assert {path.parent.name for path in (cwd / "runs").rglob("*.ckpt")}  # Lightning's checkpoints went there too
