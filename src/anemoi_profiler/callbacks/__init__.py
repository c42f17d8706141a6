"""Lightning callbacks, one concern each; `build_callbacks` assembles them from a config.

Extension points: subclass `ProfilerCallback` (decorate hooks with `guarded`) for a callback of your own, or
`StageCallback` for metrics per log interval from the session's shared stage clock (docs/extending.md).
"""

from anemoi_profiler.callbacks.base import ProfilerCallback, guarded
from anemoi_profiler.callbacks.hta import HtaCallback
from anemoi_profiler.callbacks.memory_snapshot import MemorySnapshotCallback
from anemoi_profiler.callbacks.model_summary import ModelSummaryCallback
from anemoi_profiler.callbacks.stage_callback import StageCallback
from anemoi_profiler.callbacks.system import SystemMetricsCallback
from anemoi_profiler.callbacks.throughput import ThroughputCallback
from anemoi_profiler.callbacks.timing import StepTimingCallback
from anemoi_profiler.callbacks.torch_profiler import TorchProfilerCallback

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
