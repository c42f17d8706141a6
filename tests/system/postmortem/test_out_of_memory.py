"""Out of memory: a `torch.cuda.OutOfMemoryError` in `training_step` and a DataLoader worker killed by the kernel
become the run's verdict, its record in postmortem/ and the MLflow run's tag, on CPU without the CUDA parts."""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.data import DataLoader, Dataset

from anemoi_profiler import build_callbacks
from anemoi_profiler.cli.main import main
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer
from tests.system.faults.fault_helpers import only_run, only_run_folder, quick_config

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)

OOM_AT_STEP = 7


class OutOfMemoryAt(TinyRegressor):
    """Raises what the CUDA caching allocator raises, at one known step."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == OOM_AT_STEP:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return super().training_step(batch, batch_idx)


def report_json(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


def first_verdict(report: dict[str, Any]) -> dict[str, Any]:
    return report["sections"]["Diagnosis"]["data"]["verdicts"][0]


def test_an_out_of_memory_error_is_the_verdict_with_its_step_phase_and_rank(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    store = new_store(tmp_path / "runs" / "mlflow.db")
    train, _ = loaders(n_train=16 * 20)
    with pytest.raises(torch.cuda.OutOfMemoryError, match=r"Tried to allocate 20\.00 GiB") as raised:
        trainer(build_callbacks(quick_config(tmp_path / "runs"))).fit(OutOfMemoryAt(), train)
    assert type(raised.value) is torch.cuda.OutOfMemoryError  # the user's exception, intact
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "training_step"

    folder = only_run_folder(tmp_path / "runs")
    record = json.loads((folder / "postmortem" / "oom_rank0.json").read_text())
    assert (record["kind"], record["rank"], record["step"]) == ("device", 0, OOM_AT_STEP)
    assert record["phase"] == "forward (training_step)"
    assert record["frame"].startswith("training_step (test_out_of_memory.py:")
    assert record["device"] == {"not_assessed": "no CUDA device"}
    assert record["host"]["total_mb"] > 0

    report = report_json(folder)
    assert report["header"]["status"] == "FAILED"
    assert report["header"]["postmortem"] == f"out of memory at step {OOM_AT_STEP} on rank 0 (device)"
    first = first_verdict(report)
    assert first["id"] == "out-of-memory"
    assert f"at step {OOM_AT_STEP} on rank 0, in forward (training_step) at training_step (" in first["value"]
    text = (folder / "report.txt").read_text()
    assert text.index("[high] out of memory") < text.index("Throughput")

    run = only_run(store)
    assert run.info.status == "FAILED"
    assert run.data.tags["profiler.postmortem"] == "out-of-memory"
    assert run.data.tags["profiler.verdict"].split(",")[0] == "out-of-memory"
    description = run.data.tags["mlflow.note.content"]
    assert description.index("out of memory") < description.index("Full report")
    artifacts = {a.path for a in MlflowClient(store).list_artifacts(run.info.run_id, "profiler/postmortem")}
    assert "profiler/postmortem/oom_rank0.json" in artifacts

    # a user reads the folder again later: the same verdict leads
    assert main(["report", str(folder)]) == 0
    assert first_verdict(report_json(folder))["id"] == "out-of-memory"


class KilledWorker(Dataset):
    """Sample `kill_at` makes its worker process die as the kernel's OOM killer makes it die."""

    def __init__(self, size: int, kill_at: int) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(0))
        self.kill_at = kill_at

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.kill_at:
            time.sleep(1.0)  # the batches sent before are taken first: the main process waits for this one
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)
        return self.x[index], self.x[index].sum(dim=0, keepdim=True)


def test_a_dataloader_worker_killed_by_the_kernel_is_named_with_the_host_memory(
    tmp_path: Path, new_store: Callable[[Path], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch reports the worker's signal from a SIGCHLD handler it installs once per process; a Lightning fit restores
    the signal handlers it found when it ends, so after a fit with workers in the same process (an earlier test)
    torch's handler is gone for good. Here the process is as at its first fit (docs/postmortem.md says the limit)."""
    from torch.utils.data._utils import signal_handling

    monkeypatch.setattr(signal_handling, "_SIGCHLD_handler_set", False)
    store = new_store(tmp_path / "runs" / "mlflow.db")
    data = DataLoader(KilledWorker(16 * 12, kill_at=16 * 7), batch_size=16, num_workers=1)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly") as raised:
        trainer(build_callbacks(quick_config(tmp_path / "runs"))).fit(TinyRegressor(), data)
    assert "is killed by signal: Killed" in str(raised.value.__context__)  # torch's SIGCHLD handler said it

    folder = only_run_folder(tmp_path / "runs")
    record = json.loads((folder / "postmortem" / "oom_rank0.json").read_text())
    assert record["kind"] == "host" and record["phase"] == "data fetch"
    assert "is killed by signal: Killed" in record["error"]
    assert record["host"]["total_mb"] > record["host"]["available_mb"] > 0
    first = first_verdict(report_json(folder))
    assert first["id"] == "out-of-memory" and "DataLoader worker killed" in first["value"]
    assert "host memory" in first["message"]
    assert only_run(store).data.tags["profiler.postmortem"] == "out-of-memory"
