"""Step time, dataloader wait and peak memory per log interval.

Peak device memory comes from the caching allocator's host-side counters (`max_memory_allocated`, reset
each interval), so reading it does not synchronize the device. On CPU the CUDA figures are absent.
"""

from __future__ import annotations

from typing import Any

import psutil
import torch

from .. import trainer_info
from ..report import ReportSection
from .intervals import Lap
from .stage_callback import STAGES, StageCallback

MB = 1e6  # MLflow's system metrics use decimal megabytes; so do we.


class StepTimingCallback(StageCallback):
    """Logs `time/{train,val}/step_ms`, `time/train/dataloader_wait_ms` and `memory/...` per interval."""

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_session_start(trainer, pl_module)
        device = trainer_info.root_device(trainer)
        self.cuda_device = device if device.type == "cuda" else None
        self.process = psutil.Process()
        self.peaks: dict[str, float] = {}
        if self.cuda_device is not None:
            torch.cuda.reset_peak_memory_stats(self.cuda_device)

    def lap_extras(self, stage: str) -> dict[str, float]:
        if stage != "train":  # validation peaks stay in the counters and show in the next training interval
            return {}
        extras = {"memory/cpu_rss_mb": self.process.memory_info().rss / MB}
        if self.cuda_device is not None:
            extras["memory/peak_allocated_mb"] = torch.cuda.max_memory_allocated(self.cuda_device) / MB
            extras["memory/peak_reserved_mb"] = torch.cuda.max_memory_reserved(self.cuda_device) / MB
            torch.cuda.reset_peak_memory_stats(self.cuda_device)
        for key, value in extras.items():
            self.peaks[key] = max(self.peaks.get(key, 0.0), value)
        return extras

    def on_laps(self, trainer: Any, stage: str, laps: list[tuple[Lap, float]]) -> None:
        for lap, seconds in laps:
            metrics = {f"time/{stage}/step_ms": seconds / lap.batches * 1000}
            if stage == "train":
                metrics["time/train/dataloader_wait_ms"] = lap.wait_s / lap.batches * 1000
                metrics.update(lap.extras)
            self.session.log_metrics(metrics, lap.step)

    def summarize(self, trainer: Any) -> tuple[ReportSection | None, dict[str, float]]:
        values: dict[str, tuple[Any, str]] = {}
        summary: dict[str, float] = {}
        for stage in STAGES:
            totals = self.totals[stage]
            if totals["batches"] and totals["elapsed_s"] > 0:
                step_ms = totals["elapsed_s"] / totals["batches"] * 1000
                values[f"{stage}/step_ms"] = (step_ms, "ms")
                summary[f"summary/{stage}/step_ms"] = step_ms
        train = self.totals["train"]
        if train["batches"] and train["elapsed_s"] > 0:
            wait_ms = train["wait_s"] / train["batches"] * 1000
            values["train/dataloader_wait_ms"] = (wait_ms, "ms")
            values["train/dataloader_wait_share"] = (train["wait_s"] / train["elapsed_s"] * 100, "%")
            summary["summary/train/dataloader_wait_ms"] = wait_ms
        for key, value in self.peaks.items():
            values[key.replace("memory/", "max ")] = (value, "MB")
            summary[f"summary/{key}"] = value
        if not values:
            return None, {}
        return ReportSection.key_values("Step time and memory", values), summary
