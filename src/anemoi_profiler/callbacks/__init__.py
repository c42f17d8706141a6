"""Lightning callbacks, one concern each; `build_callbacks` assembles them from a config."""

from .base import ProfilerCallback
from .system import SystemMetricsCallback
from .throughput import ThroughputCallback
from .timing import StepTimingCallback

__all__ = ["ProfilerCallback", "StepTimingCallback", "SystemMetricsCallback", "ThroughputCallback"]
