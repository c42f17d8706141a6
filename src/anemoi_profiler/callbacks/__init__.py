"""Lightning callbacks, one concern each; `build_callbacks` assembles them from a config.

Extension points: subclass `ProfilerCallback` (decorate hooks with `guarded`) for a callback of your own, or
`StageCallback` for metrics per log interval from the session's shared stage clock (docs/extending.md).
"""

from .base import ProfilerCallback, guarded
from .hta import HtaCallback
from .memory_snapshot import MemorySnapshotCallback
from .model_summary import ModelSummaryCallback
from .stage_callback import StageCallback
from .system import SystemMetricsCallback
from .throughput import ThroughputCallback
from .timing import StepTimingCallback
from .torch_profiler import TorchProfilerCallback

__all__ = [
    "HtaCallback",
    "MemorySnapshotCallback",
    "ModelSummaryCallback",
    "ProfilerCallback",
    "StageCallback",
    "StepTimingCallback",
    "SystemMetricsCallback",
    "ThroughputCallback",
    "TorchProfilerCallback",
    "guarded",
]
