"""Peak memory per training log interval, read by the stage clock at each interval's end: the step timing's figures.

Peak device memory comes from the caching allocator's host-side counters (`max_memory_allocated`, reset each
interval), so reading it does not synchronize the device; the process's resident memory from psutil. On CPU the
CUDA figures are absent. Validation peaks stay in the counters and show in the next training interval.
"""

from __future__ import annotations

import psutil
import torch

from anemoi_profiler import names
from anemoi_profiler.report_sections import MB

PEAK_FIELDS = {
    "peak_allocated_mb": names.PEAK_ALLOCATED_MB,
    "peak_reserved_mb": names.PEAK_RESERVED_MB,
    "cpu_rss_mb": names.CPU_RSS_MB,
}
"""The `RankTotals` field of each reading, for every rank's `_max` figures."""


class MemoryPeaks:
    def __init__(self, device: torch.device) -> None:
        """Resets the device's peak counters: the first interval's peak is the training's, not the model loading's."""
        self._cuda_device = device if device.type == "cuda" else None
        self._resident = psutil.Process()
        self.peaks: dict[str, float] = {}
        """The largest reading of each metric over the run."""
        if self._cuda_device is not None:
            torch.cuda.reset_peak_memory_stats(self._cuda_device)

    def read(self) -> dict[str, float]:
        """This interval's readings by metric name; the device's peak counters start again."""
        readings = {names.CPU_RSS_MB: self._resident.memory_info().rss / MB}
        if self._cuda_device is not None:
            readings[names.PEAK_ALLOCATED_MB] = torch.cuda.max_memory_allocated(self._cuda_device) / MB
            readings[names.PEAK_RESERVED_MB] = torch.cuda.max_memory_reserved(self._cuda_device) / MB
            torch.cuda.reset_peak_memory_stats(self._cuda_device)
        for key, value in readings.items():
            self.peaks[key] = max(self.peaks.get(key, 0.0), value)
        return readings
