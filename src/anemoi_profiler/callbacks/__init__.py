"""Lightning callbacks, one concern each; `build_callbacks` assembles them from a config."""

from .base import ProfilerCallback
from .hta import HtaCallback
from .memory_snapshot import MemorySnapshotCallback
from .model_summary import ModelSummaryCallback
from .system import SystemMetricsCallback
from .throughput import ThroughputCallback
from .timing import StepTimingCallback
from .torch_profiler import TorchProfilerCallback

__all__ = [
    "HtaCallback",
    "MemorySnapshotCallback",
    "ModelSummaryCallback",
    "ProfilerCallback",
    "StepTimingCallback",
    "SystemMetricsCallback",
    "ThroughputCallback",
    "TorchProfilerCallback",
]
