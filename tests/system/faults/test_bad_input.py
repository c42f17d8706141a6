"""Bad input: config files, batches the profiler cannot count, damaged traces, snapshots and spools.

Each gets a message naming the problem; the CLI exits non-zero without a traceback; nothing already written
is changed. What test_config, test_throughput and test_hta_analysis already cover is not repeated here (see
docs/reliability.md for the map).
"""

from __future__ import annotations

import gzip
import json
import logging
import pickle
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from anemoi_profiler import build_callbacks, names
from anemoi_profiler.cli.main import main
from anemoi_profiler.measure.snapshot_reader import load_snapshot, summarize_snapshot
from anemoi_profiler.reports.run_data import read_history
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.tracking.spool import pending_batches, write_batch
from tests.helpers.lightning_models import loaders, trainer
from tests.helpers.mlflow_server import free_port
from tests.system.faults.fault_helpers import quick_config

pytestmark = pytest.mark.faults


def files_and_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- config files given to the CLI ----
@pytest.mark.parametrize(
    ("yaml_text", "named"),
    [
        ("tracking:\n\turi: x\n", "not valid YAML"),
        ("log_every_n_steps: ten\n", "log_every_n_steps: Value 'ten'"),
        ("profiler:\n  train:\n    activ: 3\n", "profiler.train.activ: unknown key; allowed keys in profiler.train:"),
        ("profiler:\n  val:\n    wait: -2\n", "profiler.val.wait: got -2, expected an integer >= 0"),
        ("output_dir: ${oops}\n", "output_dir: Interpolation key 'oops' not found"),
    ],
    ids=["syntax error", "wrong type", "unknown nested key", "negative steps", "missing interpolation"],
)
def test_config_file_errors_exit_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture, yaml_text: str, named: str
) -> None:
    path = tmp_path / "profiler.yaml"
    path.write_text(yaml_text)
    assert main(["config", "--config", str(path)]) == 2  # returned, not raised: no traceback
    err = capsys.readouterr().err
    assert err.startswith("anemoi-profiler: config error: ") and named in err


def test_a_binary_config_file_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "profiler.yaml"
    path.write_bytes(b"\xff\xfe\x00 not text")
    assert main(["config", "--config", str(path)]) == 2
    assert str(path) in capsys.readouterr().err


def test_a_value_where_a_section_belongs_names_the_section(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "profiler.yaml"
    path.write_text("throughput: 5\n")
    assert main(["config", "--config", str(path)]) == 2
    assert "config error: throughput:" in capsys.readouterr().err


# ---- batches the profiler cannot count ----
class IgnoresItsBatch(pl.LightningModule):
    """Trains a bias on whatever the dataloader gives (here lists of strings)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self.bias**2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_batches_without_tensors_train_and_say_once_that_samples_are_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    texts = DataLoader([f"sentence {i}" for i in range(40)], batch_size=4, collate_fn=list)
    config = quick_config(tmp_path / "runs", "tracking.enabled=false", "system.enabled=false")
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        fit = trainer(build_callbacks(config))
        fit.fit(IgnoresItsBatch(), texts)
    assert fit.global_step == 10
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("cannot find the batch size in a batch of type list" in m for m in warnings) == 1, warnings
    history = read_history(run_folders(tmp_path / "runs")[0])
    assert history[names.TRAIN_BATCHES_PER_SEC]["step"] == [2, 4, 6, 8, 10]
    assert names.TRAIN_SAMPLES_PER_SEC not in history


def test_a_batch_size_fn_that_raises_falls_back_to_counting_tensors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(batch: Any) -> int:
        raise TypeError("batch is not a dict")

    from tests.helpers.lightning_models import TinyRegressor

    config = quick_config(tmp_path / "runs", "tracking.enabled=false", "system.enabled=false")
    train, _ = loaders(n_train=16 * 10)
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        fit = trainer(build_callbacks(config, batch_size_fn=broken))
        fit.fit(TinyRegressor(), train)
    assert fit.global_step == 10
    assert sum("batch_size_fn raised TypeError" in r.getMessage() for r in caplog.records) == 1
    assert read_history(run_folders(tmp_path / "runs")[0])[names.TRAIN_SAMPLES_PER_SEC]["step"][-1] == 10


# ---- analyze: damaged traces, no traces, run ids that look like paths ----
def write_trace(path: Path, rank: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    trace = {"distributedInfo": {"rank": rank, "world_size": 1}, "traceEvents": [{"name": "ProfilerStep#1"}]}
    with gzip.open(path, "wt") as file:
        json.dump(trace, file)


def run_folder_with_an_earlier_analysis(root: Path) -> Path:
    folder = root / "20260101-000000_0123abcd"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("log_every_n_steps: 2\n")
    (folder / "environment.json").write_text("{}")
    (folder / "hta").mkdir()
    (folder / "hta" / "summary.json").write_text('{"ran": ["temporal_breakdown"]}')
    return folder


@pytest.mark.parametrize("damage", ["cut in half", "not gzip at all", "empty file"])
def test_a_damaged_trace_among_good_windows_is_named_and_nothing_is_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture, damage: str
) -> None:
    folder = run_folder_with_an_earlier_analysis(tmp_path)
    write_trace(folder / "traces" / "train" / "window_0" / "rank0.pt.trace.json.gz", rank=0)
    damaged = folder / "traces" / "train" / "window_1" / "rank0.pt.trace.json.gz"
    write_trace(damaged, rank=0)
    whole = damaged.read_bytes()
    damaged.write_bytes({"cut in half": whole[: len(whole) // 2], "not gzip at all": b"{}", "empty file": b""}[damage])
    before = files_and_bytes(folder)

    assert main(["analyze", str(folder)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("anemoi-profiler analyze: ") and str(damaged) in err and len(err.splitlines()) == 1
    assert files_and_bytes(folder) == before


def test_a_run_folder_without_traces_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = run_folder_with_an_earlier_analysis(tmp_path)
    before = files_and_bytes(folder)
    assert main(["analyze", str(folder)]) == 1
    assert "no trace files" in capsys.readouterr().err
    assert files_and_bytes(folder) == before


@pytest.mark.parametrize("run_id", ["../../etc", "../../../tmp/escaped", "abc/../../def", "/etc/passwd-not-here"])
def test_a_run_id_that_is_a_path_is_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture, run_id: str
) -> None:
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    store = tmp_path / "store.db"
    started = time.perf_counter()
    assert main(["analyze", str(work / run_id), "--tracking-uri", f"sqlite:///{store}"]) == 1
    assert time.perf_counter() - started < 5, "it asked MLflow about a run id that cannot be one"
    assert "nor an MLflow run id" in capsys.readouterr().err
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["a", "a/b", "a/b/c"]


# ---- memory snapshots ----
GOOD_SNAPSHOT = pickle.dumps({"segments": [], "device_traces": []})


@pytest.mark.parametrize(
    ("name", "content"),
    [
        pytest.param("empty.pickle", b"", id="empty"),
        pytest.param("cut.pickle", GOOD_SNAPSHOT[: len(GOOD_SNAPSHOT) // 2], id="cut short"),
        pytest.param("text.pickle", b"this is a log file, not a snapshot", id="not a pickle"),
        pytest.param("cut.pickle.gz", gzip.compress(GOOD_SNAPSHOT)[:12], id="gzip cut short"),
        pytest.param("plain.pickle.gz", GOOD_SNAPSHOT, id="not gzip"),
    ],
)
def test_a_damaged_snapshot_is_refused_naming_the_file(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{name}: not a CUDA memory snapshot"):
        load_snapshot(path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        pytest.param("future_protocol.pickle", b"\x80\x09" + GOOD_SNAPSHOT[2:], id="future protocol"),
        pytest.param("huge_frame.pickle", b"\x80\x04\x95" + (2**62).to_bytes(8, "little") + b"}", id="huge frame"),
        pytest.param("wrong_shape.pickle", pickle.dumps({"segments": [{"blocks": []}]}), id="wrong shape"),
    ],
)
def test_a_snapshot_damaged_in_other_ways_is_refused_naming_the_file(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=name):
        summarize_snapshot(load_snapshot(path))


# ---- sync ----
def test_sync_sends_what_it_can_and_keeps_a_damaged_spool_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
    new_store: Any,
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    spool = tmp_path / "run" / "spool" / "rank0"
    sink = TrackingSink(f"http://127.0.0.1:{free_port()}", "e", spool, flush_interval_s=0.1)
    sink.log_metrics({"loss": 1.0}, step=1)
    sink.log_metrics({"loss": 2.0}, step=2)
    assert not sink.close("FINISHED", timeout_s=10)
    (damaged,) = pending_batches(spool)
    damaged.write_text(damaged.read_text()[:20])
    later = Batch(metrics=[["loss", 3.0, int(time.time() * 1000), 3]], terminate="FINISHED")
    write_batch(later, spool / "batch-99999999999999999999-000000.json")
    folder = tmp_path / "run"

    target = new_store(tmp_path / "later.db")
    assert main(["sync", str(folder), "--tracking-uri", target]) == 1
    assert "sent 1 batch(es), 1 left" in capsys.readouterr().out
    assert f"spool file {damaged} is unreadable" in caplog.text
    assert damaged.with_name(damaged.name + ".unreadable").is_file()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(target)
    (run,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [3]


def test_sync_of_a_folder_without_a_spool_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["sync", str(tmp_path)]) == 1
    assert f"nothing to sync: no spool in {tmp_path}" in capsys.readouterr().err
