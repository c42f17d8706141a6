"""Every metric point a run logged, kept for `metrics.json` in the run folder.

With it, reports, plots and `compare` work from the run folder alone, without MLflow (they read it with
`reports.run_data.read_history`). Memory stays bounded over any run length: a key past `max_points` keeps
every other point, so its curve keeps its shape.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anemoi_profiler.run_files.layout import METRICS_FILE


class MetricHistory:
    def __init__(self, max_points: int = 4000) -> None:
        self.max_points = max_points
        self._points: dict[str, list[tuple[int, float, float]]] = {}
        self._lock = threading.Lock()  # the system sampler logs from its own thread

    def add(self, metrics: Mapping[str, float], step: int) -> None:
        now = round(time.time(), 3)
        with self._lock:
            for key, value in metrics.items():
                points = self._points.setdefault(key, [])
                points.append((int(step), float(value), now))
                if len(points) > self.max_points:
                    points[:] = points[::2]

    def to_json(self) -> dict[str, dict[str, list[Any]]]:
        with self._lock:
            return {
                key: {"step": [p[0] for p in points], "value": [p[1] for p in points], "time": [p[2] for p in points]}
                for key, points in sorted(self._points.items())
            }

    def write(self, folder: Path) -> Path:
        path = folder / METRICS_FILE
        path.write_text(json.dumps(self.to_json()))
        return path
