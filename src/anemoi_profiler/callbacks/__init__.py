"""Lightning callbacks, one concern each; `build_callbacks` assembles them from a config."""

from .base import ProfilerCallback
from .memory_snapshot import MemorySnapshotCallback
from .model_summary import ModelSummaryCallback
from .system import SystemMetricsCallback
from .throughput import ThroughputCallback
from .timing import StepTimingCallback

__all__ = [
    "MemorySnapshotCallback",
    "ModelSummaryCallback",
    "ProfilerCallback",
    "StepTimingCallback",
    "SystemMetricsCallback",
    "ThroughputCallback",
]
