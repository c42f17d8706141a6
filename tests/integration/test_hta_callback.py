"""The HTA step after a real fit: it always leaves hta/summary.json and never fails the training."""

from __future__ import annotations

import json
from pathlib import Path

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


def fit_with(tmp_path: Path, *overrides: str) -> Path:
    config = ProfilerConfig.load(
        None,
        [f"output_dir={tmp_path}", "tracking.enabled=false", "system.enabled=false", "report.console=false",
         "hta.enabled=true", *overrides],
    )  # fmt: skip
    train, val = loaders(n_train=160)
    fit = trainer(build_callbacks(config), limit_val_batches=2)
    fit.fit(TinyRegressor(), train, val)
    assert fit.global_step == 10
    (folder,) = run_folders(tmp_path)
    return folder


def test_cpu_traces_are_checked_and_gpu_analyses_skipped_with_the_reason(tmp_path: Path) -> None:
    folder = fit_with(
        tmp_path, "profiler.enabled=true", "profiler.train.skip_first=1", "profiler.train.wait=0",
        "profiler.train.warmup=1", "profiler.train.active=2",
    )  # fmt: skip
    summary = json.loads((folder / "hta" / "summary.json").read_text())
    windows = {window["window"]: window for window in summary["windows"]}
    assert set(windows) == {"train/window_0", "val/window_0"}
    assert windows["train/window_0"]["ranks"] == [0]
    assert windows["train/window_0"]["ran"] == []
    assert "no GPU kernels" in windows["train/window_0"]["skipped"]["idle_time_breakdown"]
    report = json.loads((folder / "report.json").read_text())
    assert "HTA" in report["sections"]


def test_without_traces_the_summary_says_why(tmp_path: Path) -> None:
    folder = fit_with(tmp_path)
    summary = json.loads((folder / "hta" / "summary.json").read_text())
    assert summary["ran"] == [] and "no trace files" in summary["skipped"]["all"]


class RecordingExchange:
    """The rank exchange of rank 0 in a two-rank job, recording what the session does with it."""

    world_size = 2

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def gather(self, values: list[float]) -> list[list[float]]:
        self.events.append("last exchange")
        return [values, values]

    def close(self) -> None:
        self.events.append("other ranks released")


def test_rank_0_analyses_only_after_the_other_ranks_are_released(tmp_path: Path) -> None:
    """The other ranks leave at the session's last exchange; HTA (minutes at scale) must not hold them there."""
    config = ProfilerConfig.load(None, [f"output_dir={tmp_path}", "tracking.enabled=false", "report.html=false",
                                        "report.console=false", "hta.enabled=true"])  # fmt: skip
    events: list[str] = []
    callbacks = build_callbacks(config)
    session = callbacks[0].session
    fit = trainer(callbacks, max_steps=4)
    train, _ = loaders(n_train=64)
    original_start = session._start

    def start_with_two_ranks(trainer: object) -> None:
        original_start(trainer)
        session.exchange = RecordingExchange(events)
        session.after_release(lambda: events.append("rank 0's analysis") or None)

    session._start = start_with_two_ranks  # type: ignore[method-assign]
    fit.fit(TinyRegressor(), train)

    assert events[-3:] == ["last exchange", "other ranks released", "rank 0's analysis"]
    (folder,) = run_folders(tmp_path)
    assert (folder / "hta" / "summary.json").is_file()  # the HTA callback's own analysis ran there too
