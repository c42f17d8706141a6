"""The callbacks built from YAML: LightningCLI's `class_path`/`init_args` (the example, and in-process), and
callbacks given equal configs sharing one session, as `build_callbacks` gives."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightning.pytorch.cli import LightningCLI
from mlflow.tracking import MlflowClient

from anemoi_profiler import StepTimingCallback, SystemMetricsCallback, ThroughputCallback, names
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_cli"


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """LightningCLI(args=...) in-process: pytest's own arguments are not for it."""
    monkeypatch.setattr(sys, "argv", ["train.py"])


def cli_trainer(callbacks: list[dict[str, Any]], **trainer_args: Any) -> LightningCLI:
    args = {
        "seed_everything": 0,  # LightningCLI otherwise picks one and warns that it did
        "trainer": {
            "max_steps": 30,
            "accelerator": "cpu",
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": callbacks,
            **trainer_args,
        },
    }
    return LightningCLI(TinyRegressor, run=False, args=args, save_config_callback=None)


def profiler_section(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "output_dir": str(tmp_path / "runs"),
        "log_every_n_steps": 5,
        "tracking": {"enabled": False},
        "throughput": {"warmup_steps": 2},
        "system": {"interval_s": 0.2},
        "report": {"console": False},
        **extra,
    }


def sections(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())["sections"]


@pytest.mark.slow
def test_lightning_cli_example_puts_every_callback_into_the_loggers_run(tmp_path: Path) -> None:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py"), "fit", "--config", str(EXAMPLE / "config.yaml"),
         "--trainer.max_steps=60", "--trainer.enable_progress_bar=false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [path.name for path in tmp_path.iterdir()] == ["lightning_cli_run"]  # one folder, named in the YAML

    written = tmp_path / "lightning_cli_run"
    (folder,) = run_folders(written / "profiler")  # three callbacks, one session
    assert {"Throughput", "Step time and memory", "System"} <= set(sections(folder))
    client = MlflowClient("sqlite:///" + str(written / "mlflow.db"))
    (run,) = client.search_runs([client.get_experiment_by_name("lightning-cli").experiment_id])
    assert {"train/loss", names.TRAIN_SAMPLES_PER_SEC, names.TRAIN_STEP_MS, names.CPU_UTILIZATION,
            names.SUMMARY_TRAIN_SAMPLES_PER_SEC} <= set(run.data.metrics)  # fmt: skip
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id, "profiler")}
    assert "profiler/report.txt" in artifacts
    saved = client.download_artifacts(run.info.run_id, "lightning_cli/config.yaml", str(tmp_path))
    callbacks = yaml.safe_load(Path(saved).read_text())["trainer"]["callbacks"]
    assert [item["init_args"]["config"]["log_every_n_steps"] for item in callbacks] == [20, 20, 20]


def test_lightning_cli_refuses_a_misspelt_profiler_key_before_training(tmp_path: Path) -> None:
    config = tmp_path / "cli.yaml"
    section = {"output_dir": str(tmp_path / "runs"), "throughput": {"warmupsteps": 3}}
    callback = {"class_path": "anemoi_profiler.ThroughputCallback", "init_args": {"config": section}}
    config.write_text(yaml.safe_dump({"trainer": {"callbacks": [callback]}}))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py"), "fit", "--config", str(config)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "throughput.warmupsteps: unknown key; allowed keys in throughput: enabled, warmup_steps" in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_callbacks_built_by_lightning_cli_share_one_session(tmp_path: Path) -> None:
    section = profiler_section(tmp_path)
    cli = cli_trainer(
        [{"class_path": f"anemoi_profiler.{name}", "init_args": {"config": section}}
         for name in ("ThroughputCallback", "StepTimingCallback", "SystemMetricsCallback")]
    )  # fmt: skip
    callbacks = [c for c in cli.trainer.callbacks if type(c).__module__.startswith("anemoi_profiler")]
    assert [type(c) for c in callbacks] == [ThroughputCallback, StepTimingCallback, SystemMetricsCallback]
    assert callbacks[0].config.profiler.val.active == 2  # the nested defaults LightningCLI filled in
    cli.trainer.fit(cli.model, *loaders())

    assert len({id(c.session) for c in callbacks}) == 1
    (folder,) = run_folders(tmp_path / "runs")
    assert {"Throughput", "Step time and memory", "System"} <= set(sections(folder))


def test_lightning_cli_takes_a_preset_name_or_a_yaml_path(tmp_path: Path) -> None:
    path = tmp_path / "profiler.yaml"
    path.write_text(yaml.safe_dump(profiler_section(tmp_path, log_every_n_steps=7)))
    cli = cli_trainer(
        [{"class_path": "anemoi_profiler.ThroughputCallback", "init_args": {"config": str(path)}},
         {"class_path": "anemoi_profiler.TorchProfilerCallback", "init_args": {"config": "detailed"}}]
    )  # fmt: skip
    throughput, torch_profiler = (c for c in cli.trainer.callbacks if type(c).__module__.startswith("anemoi_profiler"))
    assert throughput.config.log_every_n_steps == 7
    assert torch_profiler.config.profiler.enabled and torch_profiler.config.output_dir == "profiler_runs"


def test_values_that_types_allow_but_the_profiler_does_not_fail_at_construction(tmp_path: Path) -> None:
    section = profiler_section(tmp_path, log_every_n_steps=0)
    # jsonargparse wraps the ConfigError in its own ValueError; the message still names the key
    with pytest.raises(ValueError, match=r"log_every_n_steps: got 0, expected an integer >= 1"):
        cli_trainer([{"class_path": "anemoi_profiler.ThroughputCallback", "init_args": {"config": section}}])


def test_separately_made_callbacks_with_equal_configs_share_one_run_folder(tmp_path: Path) -> None:
    section = profiler_section(tmp_path)
    callbacks = [ThroughputCallback(section), StepTimingCallback(section), SystemMetricsCallback(section)]
    train, val = loaders()
    trainer(callbacks, max_steps=20).fit(TinyRegressor(), train, val)
    (folder,) = run_folders(tmp_path / "runs")
    assert {"Throughput", "Step time and memory", "System"} <= set(sections(folder))


def test_callbacks_with_different_configs_keep_apart_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    throughput = ThroughputCallback(profiler_section(tmp_path))
    timing = StepTimingCallback(profiler_section(tmp_path, log_every_n_steps=3))
    train, val = loaders()
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        trainer([throughput, timing], max_steps=20).fit(TinyRegressor(), train, val)
    assert throughput.session is not timing.session
    assert len(run_folders(tmp_path / "runs")) == 2
    assert any(
        "StepTimingCallback has another config than ThroughputCallback" in record.getMessage()
        for record in caplog.records
    )
