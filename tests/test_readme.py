"""README's "Use it with your Trainer" snippet runs as written, and writes only below the folder it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import names

REPO = Path(__file__).resolve().parents[1]

# The snippet leaves the model, its data and profiler.yaml to the reader: a tiny model whose batches have the
# "tokens" its length_fn counts, the simple preset's YAML, and a Trainer cut to a few steps.
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


def readme_snippet() -> str:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"## Use it with your Trainer.*?```python\n(.*?)```", readme, re.DOTALL)
    assert found, "README.md has no Python snippet under 'Use it with your Trainer'"
    return found.group(1)


@pytest.mark.slow
def test_readme_snippet_writes_only_below_its_folder(tmp_path: Path) -> None:
    snippet = readme_snippet()
    assert '"profiler.yaml"' in snippet and "L.Trainer(" in snippet
    snippet = snippet.replace('"profiler.yaml"', repr(str(REPO / "examples" / "simple.yaml")))
    snippet = snippet.replace("L.Trainer(", "L.Trainer(max_steps=30, enable_progress_bar=False, ")
    script = tmp_path / "snippet.py"
    script.write_text(HARNESS + snippet)
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
