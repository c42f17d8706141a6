"""Real Lightning fits on CPU with a real sqlite MLflow store: what lands in the run and the run folder."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.report_sections import ReportSection, RunReport
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


ALWAYS_ON = [
    names.TRAIN_SAMPLES_PER_SEC,
    names.TRAIN_BATCHES_PER_SEC,
    names.TRAIN_DEVICE_SAMPLES_PER_SEC,
    names.VAL_SAMPLES_PER_SEC,
    names.TRAIN_STEP_MS,
    names.TRAIN_DATALOADER_WAIT_MS,
    names.VAL_STEP_MS,
    names.CPU_RSS_MB,
    names.CPU_UTILIZATION,
    names.system("system_memory_usage_megabytes"),
    names.SUMMARY_TRAIN_SAMPLES_PER_SEC,
    names.SUMMARY_VAL_SAMPLES_PER_SEC,
    names.SUMMARY_TRAIN_STEP_MS,
]


def config_for(tmp_path: Path, *overrides: str) -> ProfilerConfig:
    return ProfilerConfig.load(
        None,
        [
            f"output_dir={tmp_path / 'runs'}",
            "log_every_n_steps=4",
            "throughput.warmup_steps=2",
            "system.interval_s=0.5",
            "report.console=false",
            *overrides,
        ],
    )


def only_run_folder(tmp_path: Path) -> Path:
    folders = run_folders(tmp_path / "runs")
    assert len(folders) == 1, folders
    return folders[0]


def test_metrics_and_artifacts_land_in_the_loggers_run(tmp_path: Path, sqlite_uri: str) -> None:
    logger = MLFlowLogger(experiment_name="users-exp", tracking_uri=sqlite_uri, run_name="mine")
    train, val = loaders()
    fit = trainer(
        build_callbacks(config_for(tmp_path)),
        logger=logger,
        val_check_interval=8,
        limit_val_batches=2,
        log_every_n_steps=4,
    )
    fit.fit(TinyRegressor(), train, val)

    wait_for_mlflow()
    client = MlflowClient(sqlite_uri)
    run = client.get_run(logger.run_id)
    assert run.info.run_name == "mine"
    # one run only: the profiler wrote into the logger's run
    assert len(client.search_runs([run.info.experiment_id])) == 1
    missing = [key for key in ALWAYS_ON if key not in run.data.metrics]
    assert not missing, missing
    assert "train/loss" in run.data.metrics
    for key, value in run.data.metrics.items():
        assert math.isfinite(value), key
    history_points = client.get_metric_history(logger.run_id, names.TRAIN_SAMPLES_PER_SEC)
    # 16 batches, 2 warmup, logged every 4 -> intervals end at batch 6, 10, 14 and the rest at the end
    assert len(history_points) == 4
    assert all(point.value > 0 for point in history_points)
    system_steps = [m.step for m in client.get_metric_history(logger.run_id, names.CPU_UTILIZATION)]
    assert len(system_steps) >= 2  # a sample at the start and one at the end, even for a short run
    assert system_steps == sorted(system_steps) and system_steps[-1] == 16  # on the training step axis

    artifacts = {a.path for a in client.list_artifacts(logger.run_id, "profiler")}
    assert {
        "profiler/config.yaml",
        "profiler/environment.json",
        "profiler/report.txt",
        "profiler/report.json",
    } <= artifacts

    folder = only_run_folder(tmp_path)
    assert folder.name.endswith("_" + config_for(tmp_path).fingerprint())
    assert yaml.safe_load((folder / "config.yaml").read_text())["throughput"]["warmup_steps"] == 2
    environment = json.loads((folder / "environment.json").read_text())
    assert environment["packages"]["torch"] and environment["world_size"] == 1
    assert environment["precision"] == "32-true"
    report = json.loads((folder / "report.json").read_text())
    assert report["sections"]["Throughput"]["data"]["train/samples_per_sec"] == pytest.approx(
        run.data.metrics[names.SUMMARY_TRAIN_SAMPLES_PER_SEC]
    )
    assert "Throughput" in (folder / "report.txt").read_text()
    history = json.loads((folder / "metrics.json").read_text())
    assert history[names.TRAIN_SAMPLES_PER_SEC]["step"] == [p.step for p in history_points]
    assert history[names.SUMMARY_TRAIN_SAMPLES_PER_SEC]["value"] == [
        run.data.metrics[names.SUMMARY_TRAIN_SAMPLES_PER_SEC]
    ]


def test_without_a_logger_the_embedded_sqlite_store_gets_its_own_finished_run(tmp_path: Path) -> None:
    train, val = loaders(n_train=64)
    trainer(build_callbacks(config_for(tmp_path, "system.enabled=false")), limit_val_batches=1).fit(
        TinyRegressor(), train, val
    )
    wait_for_mlflow()
    database = tmp_path / "runs" / "mlflow.db"
    assert database.is_file()
    assert not (tmp_path / "mlruns").exists()
    client = MlflowClient(f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("anemoi-profiler")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == only_run_folder(tmp_path).name
    assert names.TRAIN_SAMPLES_PER_SEC in run.data.metrics


def test_logger_prefix_is_respected_except_for_system_metrics(tmp_path: Path, sqlite_uri: str) -> None:
    logger = MLFlowLogger(experiment_name="p", tracking_uri=sqlite_uri, prefix="fold1")
    train, _ = loaders(n_train=64)
    trainer(build_callbacks(config_for(tmp_path)), logger=logger).fit(TinyRegressor(), train)
    wait_for_mlflow()
    metrics = MlflowClient(sqlite_uri).get_run(logger.run_id).data.metrics
    assert "fold1-throughput/train/samples_per_sec" in metrics
    assert names.TRAIN_SAMPLES_PER_SEC not in metrics
    assert names.CPU_UTILIZATION in metrics


def test_pytorch_lightning_namespace_trainer_works_too(tmp_path: Path, sqlite_uri: str) -> None:
    import pytorch_lightning as pl_legacy
    from pytorch_lightning.loggers import MLFlowLogger as LegacyMLFlowLogger

    class LegacyRegressor(pl_legacy.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    logger = LegacyMLFlowLogger(experiment_name="legacy", tracking_uri=sqlite_uri)
    train, _ = loaders(n_train=64)
    pl_legacy.Trainer(
        max_epochs=1,
        accelerator="cpu",
        callbacks=build_callbacks(config_for(tmp_path, "system.enabled=false")),
        logger=logger,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    ).fit(LegacyRegressor(), train)
    wait_for_mlflow()
    assert names.TRAIN_SAMPLES_PER_SEC in MlflowClient(sqlite_uri).get_run(logger.run_id).data.metrics


def test_user_exception_passes_through_and_own_run_is_marked_failed(tmp_path: Path) -> None:
    train, _ = loaders(n_train=128)
    fit = trainer(build_callbacks(config_for(tmp_path)))
    with pytest.raises(RuntimeError, match="boom from the user's training_step"):
        fit.fit(TinyRegressor(fail_at_step=6), train)
    wait_for_mlflow()
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.info.status == "FAILED"
    # what was measured before the failure was flushed
    assert names.TRAIN_SAMPLES_PER_SEC in run.data.metrics
    assert json.loads((only_run_folder(tmp_path) / "report.json").read_text())["header"]["status"] == "FAILED"


def test_gradient_accumulation_no_validation_and_ragged_last_batch(tmp_path: Path, sqlite_uri: str) -> None:
    logger = MLFlowLogger(experiment_name="acc", tracking_uri=sqlite_uri)
    train, val = loaders(n_train=100, batch_size=16)  # 7 batches: six of 16, one of 4
    trainer(
        build_callbacks(config_for(tmp_path, "system.enabled=false", "throughput.warmup_steps=0")),
        logger=logger,
        max_epochs=2,
        accumulate_grad_batches=2,
        limit_val_batches=0,
    ).fit(TinyRegressor(), train, val)
    report = json.loads((only_run_folder(tmp_path) / "report.json").read_text())
    throughput = report["sections"]["Throughput"]["data"]
    assert throughput["train/measured_batches"] == 14
    wait_for_mlflow()
    metrics = MlflowClient(sqlite_uri).get_run(logger.run_id).data.metrics
    assert not any(key.startswith(names.throughput("val", "")) for key in metrics)
    assert all(math.isfinite(value) for value in metrics.values())
    # the step axis is the optimizer step: 7 batches with accumulation 2 step 4 times an epoch (the last
    # batch of an epoch steps too), so global_step is 8 after two epochs
    wait_for_mlflow()
    history = MlflowClient(sqlite_uri).get_metric_history(logger.run_id, names.TRAIN_STEP_MS)
    assert max(point.step for point in history) == 8


def test_secrets_in_the_tracking_uri_are_redacted_in_config_copy(tmp_path: Path) -> None:
    secret_uri = "http://alice:hunter2@127.0.0.1:9/?token=abc123"
    config = config_for(tmp_path, f"tracking.uri={secret_uri}", "tracking.enabled=false", "system.enabled=false")
    train, _ = loaders(n_train=32)
    trainer(build_callbacks(config)).fit(TinyRegressor(), train)
    folder = only_run_folder(tmp_path)
    for name in ("config.yaml", "environment.json", "report.json", "report.txt"):
        text = (folder / name).read_text()
        assert "hunter2" not in text and "abc123" not in text, name
    assert "***@127.0.0.1:9" in (folder / "config.yaml").read_text()


def test_run_folders_of_the_same_second_are_in_the_order_they_were_made(tmp_path: Path) -> None:
    """A `validate()` right after a short fit starts in the same second: its folder still comes last."""
    made = [tmp_path / "20261201-171742_e05b85b6", tmp_path / "20261201-171742_7d5a1199"]  # names sort the other way
    for nanoseconds, folder in enumerate(made, start=1):
        folder.mkdir()
        (folder / "config.yaml").write_text("{}")
        os.utime(folder / "config.yaml", ns=(nanoseconds * 10**9, nanoseconds * 10**9))
    (tmp_path / "20261201-171741_ffffffff").mkdir()  # a second earlier, config copy missing
    assert run_folders(tmp_path) == [tmp_path / "20261201-171741_ffffffff", *made]


def test_the_console_report_heads_each_section_before_its_note_and_rows(capsys: pytest.CaptureFixture[str]) -> None:
    report = RunReport({"status": "FINISHED"})
    report.add(ReportSection.key_values("Throughput", {"train/samples_per_sec": (923.8, "/s")}, "Steady state: ..."))
    report.add(ReportSection.key_values("System", {"cpu_utilization_percentage": (99.9, "")}, "Means over 3 samples."))
    report.print_console()
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    order = ["Throughput", "Steady state: ...", "train/samples_per_sec", "System", "Means over 3 samples."]
    positions = [next(i for i, line in enumerate(lines) if line.startswith(text)) for text in order]
    assert positions == sorted(positions), lines
