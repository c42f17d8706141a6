"""Window summaries where torch cannot say an event's activity type in process (torch < 2.12, as on torch 2.11).

kineto saves a window's trace only once ("Trace is already saved" the second time, seen on an H200 with torch
2.11): with traces written, the summary reads the run folder's trace; without, its own saved copy. Real CPU
fits with the check of torch's version turned to "before 2.12"; everything else runs as it would.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import pytest

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.profiling import window_summarizer as window_summaries
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


def fit(tmp_path: Path, traces: str) -> Path:
    overrides = [
        f"output_dir={tmp_path}",
        "tracking.enabled=false",
        "system.enabled=false",
        "report.console=false",
        "profiler.enabled=true",
        f"profiler.traces={traces}",
        "profiler.validation=false",
        "profiler.time_report=false",
        "profiler.memory_report=false",
        "profiler.train.skip_first=2",
        "profiler.train.wait=0",
        "profiler.train.warmup=1",
        "profiler.train.active=3",
        "profiler.train.repeat=2",
    ]
    trainer = pl.Trainer(
        max_steps=14,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=build_callbacks(ProfilerConfig.load(None, overrides)),
    )
    trainer.fit(TinyRegressor(), loaders(n_train=14 * 16)[0])
    (run_dir,) = run_folders(tmp_path)
    return run_dir


@pytest.mark.parametrize("traces", ["true", "false"])
def test_a_torch_before_2_12_summarises_every_window_from_the_saved_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, traces: str
) -> None:

    monkeypatch.setattr(window_summaries, "reads_in_process", lambda: False)
    with caplog.at_level(logging.WARNING):
        run_dir = fit(tmp_path, traces)
    assert "could not summarise" not in caplog.text
    for window in (0, 1):
        table = json.loads(
            (run_dir / "window_summaries" / "train" / f"window_{window}" / "window_summary.json").read_text()
        )
        (row,) = table["ranks"]
        assert row["rank"] == 0 and row["steps"] == 3 and row["host_busy_pct"] > 0
    written = sorted(p.name for p in (run_dir / "traces" / "train").glob("window_*/*")) if traces == "true" else []
    assert written == (["rank0.pt.trace.json.gz"] * 2 if traces == "true" else [])


def test_with_traces_off_the_helper_reads_a_copy_exported_for_it_and_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    def not_in_the_training_process(*args: object) -> None:
        raise AssertionError("a window was read in the training process")

    monkeypatch.setattr(window_summaries, "_summarize_in_process", not_in_the_training_process)
    with caplog.at_level(logging.WARNING):
        run_dir = fit(tmp_path / "runs", "false")
    assert "could not summarise" not in caplog.text  # the helper summarised every window
    for window in (0, 1):
        table = json.loads(
            (run_dir / "window_summaries" / "train" / f"window_{window}" / "window_summary.json").read_text()
        )
        assert table["ranks"][0]["steps"] == 3 and table["ranks"][0]["host_busy_pct"] > 0
    assert not list(temporary.glob("anemoi-profiler-window-*"))
    assert not (run_dir / "traces").exists() or not list((run_dir / "traces").rglob("*.gz"))
