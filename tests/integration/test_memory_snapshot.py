"""Memory snapshots: the reader on a real H200 snapshot, the recording window and failure dumps, CPU behaviour.

Without a GPU the CUDA recording API is replaced by a stand-in that checks every call against the real
signature; the tests marked `cuda` run the real thing when a GPU is present.
"""

from __future__ import annotations

import gzip
import inspect
import json
import logging
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import mlflow
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import wait_for_mlflow
from anemoi_profiler.callbacks import memory_snapshot as memory_snapshot_module
from anemoi_profiler.callbacks.memory_snapshot import MemorySnapshotCallback
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.measure.snapshot_reader import load_snapshot, summarize_snapshot

REAL_RECORD_SIGNATURE = inspect.signature(torch.cuda.memory._record_memory_history)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class UserError(RuntimeError):
    """The user's own exception: it must reach them as raised."""


class TinyModel(pl.LightningModule):
    def __init__(self, events: list[tuple[Any, ...]] | None = None, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.events = events if events is not None else []
        self.fail_at = fail_at
        self.raised: UserError | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.events.append(("batch", self.global_step))
        if self.global_step == self.fail_at:
            self.raised = UserError(f"boom at batch {self.fail_at}")
            raise self.raised
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FakeCudaMemory:
    """Stands in for `torch.cuda.memory` recording on CPU; logs its calls into the model's event list."""

    def __init__(self, events: list[tuple[Any, ...]], snapshot: dict[str, Any]) -> None:
        self.events = events
        self.snapshot = snapshot

    def record_memory_history(self, *args: Any, **kwargs: Any) -> None:
        bound = REAL_RECORD_SIGNATURE.bind(*args, **kwargs)  # what the real function would accept
        enabled = bound.arguments.get("enabled", "all")
        self.events.append(("record", enabled))
        if enabled is not None:
            assert bound.arguments["max_entries"] == 1234

    def take_snapshot(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.events.append(("snapshot",))
        return self.snapshot


@pytest.fixture
def fixture_snapshot(fixtures_dir: Path) -> dict[str, Any]:
    return load_snapshot(fixtures_dir / "memory" / "memory_snapshot.pickle.gz")


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, fixture_snapshot: dict[str, Any]) -> FakeCudaMemory:
    fake = FakeCudaMemory([], fixture_snapshot)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.take_snapshot)
    on_cuda = SimpleNamespace(root_device=lambda trainer: torch.device("cuda", 0))
    monkeypatch.setattr(memory_snapshot_module, "trainer_info", on_cuda)
    return fake


def config(tmp_path: Path, *overrides: str, tracking: bool = False) -> ProfilerConfig:
    base = [
        f"output_dir={tmp_path}",
        "system.enabled=false",
        "report.console=false",
        f"tracking.enabled={str(tracking).lower()}",
        "memory_snapshot.enabled=true",
        "memory_snapshot.start_step=2",
        "memory_snapshot.steps=2",
        "memory_snapshot.max_entries=1234",
    ]
    return ProfilerConfig.load(None, [*base, *overrides])


def fit(model: TinyModel, callback: MemorySnapshotCallback, steps: int = 6, accelerator: str = "cpu") -> None:
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(model, DataLoader(data, batch_size=8))


def run_folder(tmp_path: Path) -> Path:
    (config_copy,) = tmp_path.glob("*/config.yaml")  # the run folder; MLflow may add its own folders beside it
    return config_copy.parent


# ---- reader ----
def test_fixture_snapshot_is_summarized(fixture_snapshot: dict[str, Any]) -> None:
    summary = summarize_snapshot(fixture_snapshot)
    assert summary["devices"] == [0]
    assert summary["segments"] == 113
    assert summary["segments_by_type"] == {"large": 109, "small": 4}
    assert summary["reserved_bytes"] == 5_410_652_160
    assert summary["allocated_bytes"] == 1_478_819_840
    assert summary["live_allocations"] == 300
    assert summary["trace_entries"] == 10_379
    assert summary["trace_actions"]["alloc"] == 3565
    assert summary["ooms"] == 0
    # The run's max_memory_allocated was 5.54 GB; the two recorded steps reach 5.21 GB of it.
    assert summary["peak_allocated_bytes"] == 5_208_735_884
    largest = summary["largest_recorded_allocations"][0]
    assert largest["bytes"] == 268_435_456
    assert largest["where"] == "torch/nn/functional.py:3504 cross_entropy <- capture.py:187 step"
    assert "backward of NllLossBackward0" in [a["where"] for a in summary["largest_recorded_allocations"]]
    assert summary["largest_live_allocations"][0]["bytes"] == 33_554_432


def test_plain_and_gzipped_snapshots_read_the_same(fixtures_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "snapshot_rank0.pickle"
    with gzip.open(fixtures_dir / "memory" / "memory_snapshot.pickle.gz", "rb") as source, plain.open("wb") as target:
        shutil.copyfileobj(source, target)
    assert load_snapshot(plain) == load_snapshot(fixtures_dir / "memory" / "memory_snapshot.pickle.gz")


def test_reader_refuses_what_is_not_a_snapshot(tmp_path: Path) -> None:
    with_code = tmp_path / "evil.pickle"
    with_code.write_bytes(pickle.dumps({"segments": [], "call": print}))
    with pytest.raises(ValueError, match="plain data only"):
        load_snapshot(with_code)
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match="not a CUDA memory snapshot"):
        load_snapshot(other)


# ---- callback on CPU ----
def test_cpu_run_leaves_a_clear_note_and_no_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="anemoi_profiler"):
        fit(TinyModel(), MemorySnapshotCallback(config(tmp_path)), steps=3)
    assert "memory snapshot needs CUDA; skipped on cpu" in caplog.text
    assert [r.levelname for r in caplog.records if "memory snapshot" in r.getMessage()] == ["WARNING"]
    folder = run_folder(tmp_path)
    assert not (folder / "memory").exists()
    section = json.loads((folder / "report.json").read_text())["sections"]["Memory snapshot"]
    assert section["data"] == {"skipped": "memory snapshot needs CUDA; skipped on cpu"}


def test_cpu_run_passes_the_users_exception_unchanged(tmp_path: Path) -> None:
    model = TinyModel(fail_at=1)
    with pytest.raises(UserError, match=r"^boom at batch 1$") as raised:
        fit(model, MemorySnapshotCallback(config(tmp_path)))
    assert raised.value is model.raised


# ---- callback with the CUDA API stood in for ----
def test_window_is_recorded_then_dumped_and_recording_stops(tmp_path: Path, fake_cuda: FakeCudaMemory) -> None:
    model = TinyModel(fake_cuda.events)
    callback = MemorySnapshotCallback(config(tmp_path))
    fit(model, callback)
    assert fake_cuda.events == [
        ("record", "all"),  # on_fit_start: on_exception wants history from the start
        ("batch", 0),
        ("batch", 1),
        ("record", None),  # the window starts with an empty history
        ("record", "all"),
        ("batch", 2),
        ("batch", 3),
        ("snapshot",),
        ("record", None),
        ("batch", 4),
        ("batch", 5),
    ]
    path = run_folder(tmp_path) / "memory" / "snapshot_rank0.pickle"
    assert load_snapshot(path) == fake_cuda.snapshot
    (dump,) = callback.dumps
    assert dump.trigger == "training batches 2-3"
    assert dump.size_bytes == path.stat().st_size and dump.seconds > 0
    report = (run_folder(tmp_path) / "report.txt").read_text()
    assert "snapshot_rank0.pickle" in report and "5.41 GB" in report and "10379" in report


def test_without_on_exception_only_the_window_is_recorded(tmp_path: Path, fake_cuda: FakeCudaMemory) -> None:
    fit(TinyModel(fake_cuda.events), MemorySnapshotCallback(config(tmp_path, "memory_snapshot.on_exception=false")))
    assert [event for event in fake_cuda.events if event[0] != "batch"] == [
        ("record", "all"),
        ("snapshot",),
        ("record", None),
    ]


def test_training_that_stops_inside_the_window_keeps_what_was_recorded(
    tmp_path: Path, fake_cuda: FakeCudaMemory
) -> None:
    callback = MemorySnapshotCallback(config(tmp_path, "memory_snapshot.steps=10"))
    fit(TinyModel(fake_cuda.events), callback, steps=4)
    assert fake_cuda.events[-2:] == [("snapshot",), ("record", None)]
    assert callback.dumps[0].trigger == "training batches 2-3"


def test_exception_in_the_window_dumps_the_history_and_reaches_the_user(
    tmp_path: Path, fake_cuda: FakeCudaMemory
) -> None:
    """With a real sqlite MLflow run: the dump is written before the run folder is uploaded."""
    model = TinyModel(fake_cuda.events, fail_at=3)
    with pytest.raises(UserError, match=r"^boom at batch 3$") as raised:
        fit(model, MemorySnapshotCallback(config(tmp_path, tracking=True)))
    assert raised.value is model.raised
    assert fake_cuda.events[-3:] == [("batch", 3), ("snapshot",), ("record", None)]
    folder = run_folder(tmp_path)
    assert not (folder / "memory" / "snapshot_rank0.pickle").exists()
    assert load_snapshot(folder / "memory" / "snapshot_rank0_exception.pickle") == fake_cuda.snapshot
    report = json.loads((folder / "report.json").read_text())
    data = report["sections"]["Memory snapshot"]["data"]["snapshot_rank0_exception.pickle"]
    assert data["trigger"] == "UserError, with allocation history"
    assert report["header"]["status"] == "FAILED"
    wait_for_mlflow()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.info.status == "FAILED"
    uploaded = [a.path for a in client.list_artifacts(run.info.run_id, "profiler/memory")]
    assert uploaded == ["profiler/memory/snapshot_rank0_exception.pickle"]


def test_exception_after_the_window_dumps_the_allocator_state(tmp_path: Path, fake_cuda: FakeCudaMemory) -> None:
    callback = MemorySnapshotCallback(config(tmp_path))
    with pytest.raises(UserError):
        fit(TinyModel(fake_cuda.events, fail_at=5), callback)
    assert [dump.path.name for dump in callback.dumps] == ["snapshot_rank0.pickle", "snapshot_rank0_exception.pickle"]
    assert callback.dumps[1].trigger == "UserError, allocator state only: recording had ended"
    assert fake_cuda.events[-2:] == [("batch", 5), ("snapshot",)]  # recording had been stopped after the window


def test_a_failing_dump_never_replaces_the_users_exception(
    tmp_path: Path, fake_cuda: FakeCudaMemory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(memory_snapshot_module.pickle, "dump", no_space)
    model = TinyModel(fake_cuda.events, fail_at=3)
    with pytest.raises(UserError, match=r"^boom at batch 3$") as raised:
        fit(model, MemorySnapshotCallback(config(tmp_path)))
    assert raised.value is model.raised
    assert fake_cuda.events[-1] == ("record", None)
    assert "No space left on device" in caplog.text


# ---- the real CUDA API ----
@needs_cuda
def test_real_cuda_window_snapshot(tmp_path: Path) -> None:
    callback = MemorySnapshotCallback(config(tmp_path, "memory_snapshot.max_entries=100000"))
    fit(TinyModel(), callback, accelerator="cuda")
    summary = summarize_snapshot(load_snapshot(run_folder(tmp_path) / "memory" / "snapshot_rank0.pickle"))
    assert summary["trace_entries"] > 0 and summary["trace_actions"].get("alloc", 0) > 0
    assert summary["reserved_bytes"] >= summary["allocated_bytes"] > 0
    assert callback.dumps[0].summary == summary
    entries_before = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.ones(1 << 20, device="cuda")
    assert len(torch.cuda.memory._snapshot()["device_traces"][0]) == entries_before  # recording has stopped


class OutOfMemoryModel(TinyModel):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 1:
            torch.empty(1 << 50, dtype=torch.uint8, device=self.device)  # 1 PiB
        return super().training_step(batch, batch_idx)


@needs_cuda
def test_real_cuda_out_of_memory_is_dumped_and_reraised(tmp_path: Path) -> None:
    callback = MemorySnapshotCallback(config(tmp_path, "memory_snapshot.max_entries=100000"))
    with pytest.raises(torch.OutOfMemoryError):
        fit(OutOfMemoryModel(), callback, accelerator="cuda")
    path = run_folder(tmp_path) / "memory" / "snapshot_rank0_exception.pickle"
    summary = summarize_snapshot(load_snapshot(path))
    assert summary["ooms"] >= 1 and summary["last_oom"]["requested_bytes"] >= 1 << 50
    assert callback.dumps[0].trigger == "OutOfMemoryError, with allocation history"
