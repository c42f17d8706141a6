"""metrics.json: every point a run logged, bounded in memory over any run length."""

from __future__ import annotations

from pathlib import Path

from anemoi_profiler import names
from anemoi_profiler.reports.run_data import read_history
from anemoi_profiler.run_files.metrics_file import MetricHistory


def test_history_stays_bounded_over_100k_steps_and_keeps_the_ends(tmp_path: Path) -> None:
    history = MetricHistory(max_points=1000)
    for step in range(100_000):
        history.add({names.TRAIN_STEP_MS: float(step)}, step)
    points = history.to_json()[names.TRAIN_STEP_MS]
    assert 500 <= len(points["step"]) <= 1000
    assert points["step"][0] == 0 and points["step"][-1] >= 99_800
    assert points["step"] == sorted(points["step"])
    history.write(tmp_path)
    assert read_history(tmp_path)[names.TRAIN_STEP_MS]["value"][0] == 0.0
    assert read_history(tmp_path / "missing") == {}
