"""CUDA memory of profiled steps: per-step peaks, allocator retries and OOMs, and the memory timeline.

The readings are the caching allocator's host-side counters, so none of them synchronizes the device. The
peak counters are reset before each profiled step (that is what makes them per step).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch

from anemoi_profiler.logs import get_logger
from anemoi_profiler.report_sections import MB

log = get_logger(__name__)

MAX_STEPS_KEPT = 1000
"""Per-step rows kept for the report; maxima and totals cover every profiled step."""


class StepMemory:
    """Peak allocated/reserved memory, allocation retries and OOMs of each profiled step on one CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.steps: list[dict[str, Any]] = []
        self.measured = 0
        self.peak_allocated_mb = 0.0
        self.peak_reserved_mb = 0.0
        self.alloc_retries = 0
        self.ooms = 0
        self._retries_before = 0
        self._ooms_before = 0

    def start_step(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        stats = torch.cuda.memory_stats(self.device)
        self._retries_before = stats.get("num_alloc_retries", 0)
        self._ooms_before = stats.get("num_ooms", 0)

    def end_step(self, stage: str, window: int, batch: int) -> None:
        stats = torch.cuda.memory_stats(self.device)
        step = {
            "stage": stage,
            "window": window,
            "batch": batch,
            "peak_allocated_mb": stats.get("allocated_bytes.all.peak", 0) / MB,
            "peak_reserved_mb": stats.get("reserved_bytes.all.peak", 0) / MB,
            "alloc_retries": stats.get("num_alloc_retries", 0) - self._retries_before,
            "ooms": stats.get("num_ooms", 0) - self._ooms_before,
        }
        self.measured += 1
        self.peak_allocated_mb = max(self.peak_allocated_mb, step["peak_allocated_mb"])
        self.peak_reserved_mb = max(self.peak_reserved_mb, step["peak_reserved_mb"])
        self.alloc_retries += step["alloc_retries"]
        self.ooms += step["ooms"]
        if len(self.steps) < MAX_STEPS_KEPT:
            self.steps.append(step)

    def totals(self) -> dict[str, float]:
        return {
            "profiled_steps": self.measured,
            "peak_allocated_mb": self.peak_allocated_mb,
            "peak_reserved_mb": self.peak_reserved_mb,
            "alloc_retries": self.alloc_retries,
            "ooms": self.ooms,
        }


def export_memory_timeline(prof: Any, path: Path, device: torch.device) -> float | None:
    """Write the HTML memory timeline of the window just recorded; the seconds it took, None if nothing came.

    torch deprecates this export in favour of snapshots, but it is still the only view by category
    (parameters, activations, gradients, optimizer state); it can take minutes on long windows.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(path), device=f"cuda:{device.index or 0}")
    seconds = time.perf_counter() - started
    if not path.is_file():  # torch prints a message and writes nothing when matplotlib is missing
        log.warning("no memory timeline written to %s (it needs matplotlib)", path)
        return None
    return seconds
