"""Helpers shared by the fault-injection tests: quick configs, seeded fits, MLflow look-ups, read-only folders."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, wait_for_mlflow
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.tracking.sink import TrackingSink
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

QUICK = (
    "log_every_n_steps=2",
    "throughput.warmup_steps=0",
    "system.interval_s=0.5",
    "tracking.flush_interval_s=0.2",
    "tracking.retry_interval_s=0.5",
    "report.console=false",
)


def quick_config(output_dir: Path, *overrides: str) -> ProfilerConfig:
    """A config that logs every 2 batches and flushes often, so that short fits exercise everything."""
    return ProfilerConfig.load(None, [f"output_dir={output_dir}", *QUICK, *overrides])


def seeded_fit(callbacks: list[Any], batches: int = 10, step_sleep_s: float = 0.0) -> dict[str, torch.Tensor]:
    """Train TinyRegressor from seed 0 for `batches` batches of 16; return its final weights."""
    pl.seed_everything(0, verbose=False)
    model = TinyRegressor(step_sleep_s=step_sleep_s)
    train, _ = loaders(n_train=16 * batches)
    trainer(callbacks).fit(model, train)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_weights(profiled: dict[str, torch.Tensor], plain: dict[str, torch.Tensor]) -> None:
    assert profiled.keys() == plain.keys()
    for name in plain:
        assert torch.equal(profiled[name], plain[name]), f"{name} differs with the profiler"


def only_run_folder(output_dir: Path) -> Path:
    folders = run_folders(output_dir)
    assert len(folders) == 1, folders
    return folders[0]


def only_run(tracking_uri: str, experiment: str = "anemoi-profiler") -> Any:
    """The one run of `experiment`, once the MLflow deliveries a short fit left to the background are done."""
    wait_for_mlflow()
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {tracking_uri}"
    (run,) = client.search_runs([found.experiment_id])
    return run


def metric_steps(tracking_uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(tracking_uri).get_metric_history(run_id, key))


class LogCallTimer:
    """Records how long each `TrackingSink.log_metrics` call takes: the training thread's cost of logging."""

    def __init__(self, monkeypatch: Any) -> None:
        self.seconds: list[float] = []
        original = TrackingSink.log_metrics

        def timed(sink: TrackingSink, *args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            original(sink, *args, **kwargs)
            self.seconds.append(time.perf_counter() - started)

        monkeypatch.setattr(TrackingSink, "log_metrics", timed)

    def assert_tiny(self) -> None:
        assert self.seconds, "nothing was logged"
        ordered = sorted(self.seconds)
        median, worst = ordered[len(ordered) // 2], ordered[-1]
        assert median < 0.002, f"median log_metrics call took {median * 1000:.1f} ms"
        assert worst < 0.25, f"slowest log_metrics call took {worst * 1000:.1f} ms"  # a busy CI machine


def is_writable(folder: Path) -> bool:
    probe = folder / ".write-probe"
    try:
        probe.write_text("x")
    except OSError:
        return False
    probe.unlink()
    return True


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[str]:
    """Make `folder` unwritable for this process; yield how. As root, chmod does not stop writes, so the folder
    is bind-mounted read-only onto itself; otherwise it is chmod-ed. Skips the test if neither works."""
    import pytest

    how = ""
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, check=False)
        if mounted.returncode == 0:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True, check=False)
            how = "read-only bind mount"
    else:
        for path in folder.rglob("*"):
            path.chmod(0o444)
        folder.chmod(0o555)
        how = "chmod 555"
    try:
        if not how or is_writable(folder):
            pytest.skip(f"cannot make {folder} read-only here ({how or 'mount not permitted'})")
        yield how
    finally:
        if how == "read-only bind mount":  # lazily if a file on it is still open, so no mount outlives the test
            subprocess.run(["umount", "--lazy", str(folder)], capture_output=True, check=False)
        elif how:
            folder.chmod(0o755)
            for path in folder.rglob("*"):
                path.chmod(0o644)
