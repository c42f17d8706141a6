"""TorchProfilerCallback in real CPU fits: windows, trace layout, reports, warnings; trace and schedule helpers."""

from __future__ import annotations

import gzip
import json
import logging
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.profilers import PyTorchProfiler
from mlflow.tracking import MlflowClient
from torch import nn
from torch.profiler import ProfilerAction
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, names, wait_for_mlflow
from anemoi_profiler.callbacks.torch_profiler import TorchProfilerCallback
from anemoi_profiler.profiling.durations import Reservoir
from anemoi_profiler.profiling.schedule import WindowSchedule
from anemoi_profiler.profiling.traces import (
    TraceWriter,
    has_rank_info,
    json_size,
    read_trace,
    write_ranked_trace,
)
from anemoi_profiler.profiling.windows import MAX_TABLED_WINDOWS

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


# train: batch 0 skipped, then 2 cycles of wait 1, warmup 1, active 2 -> windows at batches 3-4 and 7-8.
# val (per validation run): 2 cycles of warmup 1, active 1 -> windows at batches 1 and 3.
WINDOWS = [
    "profiler.train.skip_first=1",
    "profiler.train.wait=1",
    "profiler.train.warmup=1",
    "profiler.train.active=2",
    "profiler.train.repeat=2",
    "profiler.val.skip_first=0",
    "profiler.val.wait=0",
    "profiler.val.warmup=1",
    "profiler.val.active=1",
    "profiler.val.repeat=2",
]


class TinyModel(pl.LightningModule):
    def __init__(self, fail_at_batch: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.fail_at_batch = fail_at_batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at_batch:
            raise RuntimeError("boom in training_step")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loaders(train_batches: int = 10, val_batches: int = 4) -> tuple[DataLoader, DataLoader]:
    x = torch.randn((train_batches + val_batches) * 8, 8, generator=torch.Generator().manual_seed(0))
    y = x.sum(dim=1, keepdim=True)
    split = train_batches * 8
    return (
        DataLoader(TensorDataset(x[:split], y[:split]), batch_size=8),
        DataLoader(TensorDataset(x[split:], y[split:]), batch_size=8),
    )


def config_for(output_dir: Path, *overrides: str, tracking: bool = False) -> ProfilerConfig:
    return ProfilerConfig.load(
        None,
        [
            f"output_dir={output_dir}",
            "system.enabled=false",
            "profiler.enabled=true",
            f"tracking.enabled={str(tracking).lower()}",
            "report.console=false",
            *WINDOWS,
            *overrides,
        ],
    )


def fit(config: ProfilerConfig, model: pl.LightningModule | None = None, **trainer_options: Any) -> pl.Trainer:
    options: dict[str, Any] = {
        "max_epochs": 1,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "callbacks": [TorchProfilerCallback(config)],
        **trainer_options,
    }
    trainer = pl.Trainer(**options)
    trainer.fit(model or TinyModel(), *loaders())
    return trainer


def run_folder(output_dir: Path) -> Path:
    (folder,) = [p for p in output_dir.iterdir() if p.is_dir()]
    return folder


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fit (with the sanity check) shared by the tests that only read its run folder."""
    output_dir = tmp_path_factory.mktemp("runs")
    trainer = fit(config_for(output_dir), num_sanity_val_steps=2)
    assert trainer.global_step == 10
    return run_folder(output_dir)


def test_one_trace_per_window_stage_and_rank(profiled_run: Path) -> None:
    traces = sorted(str(p.relative_to(profiled_run)) for p in (profiled_run / "traces").rglob("*") if p.is_file())
    # the sanity check ran 2 validation batches but is not profiled: only the real run's 2 windows
    assert traces == [
        "traces/train/window_0/rank0.pt.trace.json.gz",
        "traces/train/window_1/rank0.pt.trace.json.gz",
        "traces/val/window_0/rank0.pt.trace.json.gz",
        "traces/val/window_1/rank0.pt.trace.json.gz",
    ]


@pytest.mark.parametrize(
    ("trace", "steps"),
    [
        ("train/window_0", [3, 4]),
        ("train/window_1", [7, 8]),
        ("val/window_0", [1]),
        ("val/window_1", [3]),
    ],
)
def test_traces_are_gzipped_ranked_and_cover_their_batches(profiled_run: Path, trace: str, steps: list[int]) -> None:
    with gzip.open(profiled_run / "traces" / trace / "rank0.pt.trace.json.gz", "rt") as file:
        data = json.load(file)
    assert data["distributedInfo"]["rank"] == 0
    assert data["distributedInfo"]["world_size"] == 1
    recorded = sorted(
        int(e["name"].split("#")[1]) for e in data["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
    )
    assert recorded == steps  # ProfilerStep#<n> is the batch index of the stage
    assert any(e.get("name") == "aten::addmm" for e in data["traceEvents"])


def test_time_report_holds_the_models_operators_per_window(profiled_run: Path) -> None:
    report = json.loads((profiled_run / "time_report.json").read_text())
    windows = [(w["stage"], w["window"], w["steps"]) for w in report["windows"]]
    assert windows == [("train", 0, 2), ("train", 1, 2), ("val", 0, 1), ("val", 1, 1)]
    train = {op["operator"]: op for op in report["windows"][0]["operators"]}
    assert {"aten::addmm", "aten::linear"} <= set(train)
    assert train["aten::addmm"]["calls"] == 4  # 2 linear layers x 2 active steps
    assert train["aten::linear"]["cpu_total_ms"] >= train["aten::addmm"]["self_cpu_ms"] > 0
    assert "ProfilerStep*" not in train
    header = (profiled_run / "time_report.csv").read_text().splitlines()[0]
    assert header.startswith("stage,window,steps,rank,operator,calls,self_cpu_ms,cpu_total_ms")
    hooks = report["hooks"]
    # the profiling span is batches 1-8: 8 steps, 7 dataloader gaps; 4 validation batches in the span
    assert hooks["train/training_step"]["count"] == 8
    assert hooks["train/dataloader_next"]["count"] == 7
    assert hooks["train/backward"]["count"] == hooks["train/optimizer_step"]["count"] == 8
    assert hooks["val/validation_batch"]["count"] == 4
    for stats in hooks.values():
        assert 0 < stats["p50_ms"] <= stats["max_ms"]


def test_memory_report_explains_itself_in_every_format(profiled_run: Path) -> None:
    text = (profiled_run / "memory_report.txt").read_text()
    assert text.startswith("How to read this table:")
    for phrase in ("net allocations", "summed over all calls and all", "Negative values are frees", "peak"):
        assert phrase in text
    assert "aten::addmm" in text
    document = json.loads((profiled_run / "memory_report.json").read_text())
    assert "Negative values are frees" in document["explanation"]
    assert document["profiled_steps"] is None  # CPU: no CUDA allocator readings
    operators = {op["operator"] for op in document["windows"][0]["operators"]}
    assert "aten::addmm" in operators
    csv_lines = (profiled_run / "memory_report.csv").read_text().splitlines()
    comments = [line for line in csv_lines if line.startswith("#")]
    assert comments and "Negative values are frees" in "\n".join(comments)
    assert csv_lines[len(comments)].startswith("stage,window,steps,rank,operator,calls,self_device_mb")


def test_report_sections(profiled_run: Path) -> None:
    sections = json.loads((profiled_run / "report.json").read_text())["sections"]
    assert sections["Torch profiler"]["data"]["train windows"] == 2
    assert sections["Torch profiler"]["data"]["val windows"] == 2
    titles = list(sections)
    assert any(t.startswith("Operators by self CPU time (train") for t in titles)
    assert any(t.startswith("Memory by operator (val") for t in titles)
    assert "Lightning hooks in profiling windows" in titles
    assert "How to read this table" in (profiled_run / "report.txt").read_text()


def test_windows_table_says_how_long_each_end_held_the_training_thread(profiled_run: Path) -> None:
    section = json.loads((profiled_run / "report.json").read_text())["sections"]["Profiling windows"]
    column = section["columns"].index("end held (ms)")
    assert [(row[0], row[1]) for row in section["rows"]] == [("train", 0), ("train", 1), ("val", 0), ("val", 1)]
    assert all(float(row[column]) > 0 for row in section["rows"])
    listed = json.loads((profiled_run / "windows.json").read_text())["windows"]
    assert all(entry["end_held_ms"] > 0 for entry in listed)
    history = json.loads((profiled_run / "metrics.json").read_text())
    train, val = history[names.window_end_held("train")], history[names.window_end_held("val")]
    assert train["step"] == [5, 9]  # the global step after each window's last batch (batches 3-4 and 7-8)
    assert len(val["value"]) == 2
    assert all(value > 0 for value in train["value"] + val["value"])


def test_trace_budget_warns_and_never_writes_an_oversized_trace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fit(config_for(tmp_path, "profiler.trace_budget_mb=0.001", "profiler.validation=false"))
    folder = run_folder(tmp_path)
    assert not list((folder / "traces").rglob("*.gz"))
    assert not [p for p in (folder / "traces").rglob("*") if p.is_file()]  # no temporary files left either
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "trace of train/window_0 not written" in messages
    assert "profiler.trace_budget_mb=0.001" in messages
    assert "turn off profiler.record_shapes, profiler.profile_memory" in messages
    assert "profiler.train.active is 2" in messages
    # window 0 told the size of window 1 before it started
    assert "the next train profiling window's trace will be about" in messages
    overview = json.loads((folder / "report.json").read_text())["sections"]["Torch profiler"]["data"]
    assert overview["traces not written (too large)"] == "train/window_0, train/window_1"
    assert (folder / "time_report.csv").is_file()  # the tables do not depend on the trace


class FakeProfile:
    """Exports a trace of a chosen size, like `torch.profiler.profile.export_chrome_trace`."""

    def __init__(self, size: int) -> None:
        self.size = size

    def export_chrome_trace(self, path: str) -> None:
        padding = "x" * max(0, self.size - 40)
        Path(path).write_text(json.dumps({"traceEvents": [], "pad": padding}))


def test_trace_writer_warns_between_one_and_four_budgets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    options = config_for(tmp_path, "profiler.trace_budget_mb=0.01", "profiler.with_stack=true").profiler
    writer = TraceWriter(tmp_path, rank=3, world_size=4, options=options)
    with caplog.at_level(logging.WARNING):
        writer.write(FakeProfile(25_000), "train", 0, steps=2, active=2)  # 2.5 budgets: written, with a warning
        writer.write(FakeProfile(50_000), "train", 1, steps=2, active=2)  # 5 budgets: not written
        writer.close()
    written = tmp_path / "traces/train/window_0/rank3.pt.trace.json.gz"
    assert read_trace(written)["distributedInfo"] == {"rank": 3, "world_size": 4, "backend": "none"}
    assert not (tmp_path / "traces/train/window_1").exists()
    assert writer.skipped == ["train/window_1"]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "trace of train/window_0 is 0.025 MB, over profiler.trace_budget_mb=0.01" in messages[0]
    assert "turn off profiler.with_stack, profiler.record_shapes" in messages[0]
    assert "train/window_1 not written" in messages[1]


def test_conflicting_lightning_pytorch_profiler_disables_ours_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    lightning_profiler = PyTorchProfiler(dirpath=tmp_path / "lightning", filename="perf")
    trainer = fit(config_for(tmp_path / "runs"), profiler=lightning_profiler, max_steps=3, limit_val_batches=0)
    assert trainer.global_step == 3
    assert "two torch profilers cannot run at once" in caplog.text
    assert "PyTorchProfiler" in caplog.text
    folder = run_folder(tmp_path / "runs")
    assert not (folder / "traces").exists()
    assert not (folder / "time_report.csv").exists()


def test_windows_past_the_tabled_ones_get_no_operator_rows_and_the_report_says_so(tmp_path: Path) -> None:
    """A window past the first MAX_TABLED_WINDOWS is not parsed (no key_averages() at its end, on the training
    thread, nor its raw results kept): its trace has every operator, the report names it."""
    overrides = ["profiler.train.skip_first=0", "profiler.train.wait=0", "profiler.train.warmup=1"]
    overrides += ["profiler.train.active=1", "profiler.train.repeat=0", "profiler.validation=false"]
    fit(config_for(tmp_path, *overrides), num_sanity_val_steps=0, max_epochs=2)
    folder = run_folder(tmp_path)
    assert len(list((folder / "traces" / "train").iterdir())) == 10  # a window every 2 of the 20 batches
    report = json.loads((folder / "time_report.json").read_text())
    assert [w["window"] for w in report["windows"]] == list(range(MAX_TABLED_WINDOWS))
    memory = json.loads((folder / "memory_report.json").read_text())
    assert [w["window"] for w in memory["windows"]] == list(range(MAX_TABLED_WINDOWS))
    data = json.loads((folder / "report.json").read_text())["sections"]["Torch profiler"]["data"]
    assert data["train windows"] == 10
    assert data["windows without operator tables"].startswith("train 8, train 9: ")


def test_schedule_longer_than_the_run_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    fit(config_for(tmp_path, "profiler.train.skip_first=20", "profiler.val.repeat=3"), num_sanity_val_steps=0)
    assert "profiler.train: 2 windows need 28 batches" in caplog.text
    assert "the training run has 10: no window completes" in caplog.text
    assert "profiler.val: 3 windows need 6 batches" in caplog.text
    assert "each validation run has 4: only 2 complete" in caplog.text
    assert sorted(p.name for p in (run_folder(tmp_path) / "traces").iterdir()) == ["val"]


def test_a_rank_outside_profiled_ranks_records_nothing(tmp_path: Path) -> None:
    trainer = fit(config_for(tmp_path, "distributed.profiled_ranks=[1]"))
    assert trainer.global_step == 10
    folder = run_folder(tmp_path)
    assert not (folder / "traces").exists()
    assert not (folder / "time_report.json").exists()
    assert "Torch profiler" not in json.loads((folder / "report.json").read_text())["sections"]


def test_a_failing_step_stops_the_profiler_and_keeps_the_partial_window(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        fit(config_for(tmp_path), model=TinyModel(fail_at_batch=4))  # fails in the 2nd active step of window 0
    assert not torch.autograd.profiler._is_profiler_enabled
    trace = run_folder(tmp_path) / "traces/train/window_0/rank0.pt.trace.json.gz"
    steps = [e["name"] for e in read_trace(trace)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert steps[0] == "ProfilerStep#3"


def test_traces_over_the_upload_cap_stay_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name, cap in (("small", "200"), ("large", "0")):
        tracking = [f"tracking.uri={uri}", f"tracking.experiment={name}", f"profiler.upload_traces_max_mb={cap}"]
        fit(config_for(tmp_path / name, *tracking, tracking=True), limit_val_batches=0)
    wait_for_mlflow()
    client = MlflowClient(uri)

    def artifacts(experiment: str) -> set[str]:
        (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        found, folders = set(), ["profiler"]
        while folders:
            for item in client.list_artifacts(run.info.run_id, folders.pop()):
                (folders.append if item.is_dir else found.add)(item.path)
        return found

    small, large = artifacts("small"), artifacts("large")
    assert "profiler/traces/train/window_1/rank0.pt.trace.json.gz" in small
    assert "profiler/time_report.csv" in small and "profiler/memory_report.txt" in small
    assert not [path for path in large if "/traces/" in path]
    assert "profiler/time_report.csv" in large
    assert (run_folder(tmp_path / "large") / "traces/train/window_1/rank0.pt.trace.json.gz").is_file()


def test_validation_inside_a_training_window_is_left_to_the_training_trace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # validation after batch 4 (index 3), while training window 0 (batches 3-4) records
    fit(config_for(tmp_path), val_check_interval=4, num_sanity_val_steps=0)
    assert "not profiled on its own" in caplog.text
    folder = run_folder(tmp_path)
    # the run after batch 8 (index 7, window 1 recording) is skipped too; none is left to profile val
    assert not (folder / "traces/val").exists()
    assert len(list((folder / "traces/train").iterdir())) == 2


# ---- trace helpers on real recorded traces ----
def test_rank_patcher_reads_the_h200_trace_fixture(fixtures_dir: Path, tmp_path: Path) -> None:
    source = fixtures_dir / "traces/h200_single_gpu/rank-0.pt.trace.json.gz"
    assert not has_rank_info(source)
    assert json_size(source) > source.stat().st_size * 5  # the uncompressed size a viewer has to load
    target = tmp_path / "rank0.pt.trace.json.gz"
    write_ranked_trace(source, target, {"rank": 0, "world_size": 1, "backend": "none"})
    assert has_rank_info(target)
    patched = read_trace(target)
    assert patched["distributedInfo"]["rank"] == 0
    steps = {e["name"] for e in patched["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#24", "ProfilerStep#25", "ProfilerStep#26"}  # the events are all there


def test_rank_patcher_keeps_ranks_torch_wrote(fixtures_dir: Path, tmp_path: Path) -> None:
    source = fixtures_dir / "traces/hta_sampled_2rank/sampled_rank-1.json.gz"
    assert has_rank_info(source)
    target = tmp_path / "rank1.pt.trace.json.gz"
    write_ranked_trace(source, target, {"rank": 0, "world_size": 1, "backend": "none"})
    assert read_trace(target)["distributedInfo"] == read_trace(source)["distributedInfo"]
    assert read_trace(target)["distributedInfo"]["rank"] == 1


def test_rank_patcher_on_a_cpu_only_trace(fixtures_dir: Path, tmp_path: Path) -> None:
    source = fixtures_dir / "traces/cpu_only/rank-34.pt.trace.json.gz"
    target = tmp_path / "rank34.pt.trace.json.gz"
    write_ranked_trace(source, target, {"rank": 34, "world_size": 300, "backend": "gloo"})
    assert read_trace(target)["distributedInfo"]["rank"] == 34


# ---- window arithmetic ----
@pytest.mark.parametrize(
    "window",
    [
        WindowSchedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2),
        WindowSchedule(skip_first=0, wait=0, warmup=1, active=1, repeat=3),
        WindowSchedule(skip_first=10, wait=5, warmup=2, active=3, repeat=1),
        WindowSchedule(skip_first=2, wait=0, warmup=1, active=3, repeat=0),
    ],
)
def test_window_arithmetic_matches_torch(window: WindowSchedule) -> None:
    """Windows completed after n batches equal torch's RECORD_AND_SAVE steps; outside the span torch idles."""
    torch_schedule = window.torch_schedule()
    saves = 0
    for batch in range(60):
        assert window.completed_windows(batch) == saves, batch
        action = torch_schedule(batch)
        saves += action == ProfilerAction.RECORD_AND_SAVE
        if not window.start <= batch < window.end:
            assert action == ProfilerAction.NONE, batch


def test_shortfall_message() -> None:
    window = WindowSchedule(skip_first=10, wait=5, warmup=2, active=3, repeat=1)
    assert window.shortfall(20, "profiler.train", "the training run") is None
    message = window.shortfall(19, "profiler.train", "the training run")
    assert message is not None and "a window needs 20 batches" in message and "has 19: no window completes" in message
    assert window.end == 20 and WindowSchedule(0, 0, 1, 1, 0).end == math.inf


def test_reservoir_is_bounded_and_exact_where_it_can_be() -> None:
    reservoir = Reservoir(capacity=100)
    for value in range(10_000):
        reservoir.add(float(value))
    assert len(reservoir.sample) == 100
    assert reservoir.count == 10_000 and reservoir.max == 9999.0
    assert reservoir.total / reservoir.count == pytest.approx(4999.5)
    assert 3000 < reservoir.quantile(0.5) < 7000


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fit_records_kernels_step_memory_and_the_timeline(tmp_path: Path) -> None:
    fit(config_for(tmp_path, "profiler.memory_timeline=true"), accelerator="gpu", devices=1, limit_val_batches=0)
    folder = run_folder(tmp_path)
    trace = read_trace(folder / "traces/train/window_0/rank0.pt.trace.json.gz")
    assert trace["distributedInfo"]["rank"] == 0
    assert "kernel" in {e.get("cat") for e in trace["traceEvents"]}
    time_report = json.loads((folder / "time_report.json").read_text())
    assert any(op["self_device_ms"] > 0 for op in time_report["windows"][0]["operators"])
    memory = json.loads((folder / "memory_report.json").read_text())
    totals = memory["profiled_steps"]["totals"]
    assert totals["profiled_steps"] == 4  # 2 windows x 2 active steps
    assert totals["peak_allocated_mb"] > 0 and totals["ooms"] == 0
    assert memory["windows"][0]["device"] is True
    assert memory["memory_timeline"]["seconds"] > 0
    assert (folder / "memory/timeline_rank0.html").stat().st_size > 0
