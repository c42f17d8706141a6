"""anemoi-profiler: how fast, memory-hungry and balanced Lightning training is, in MLflow and HTA."""

from importlib.metadata import PackageNotFoundError, version

from .build import build_callbacks
from .callbacks import ProfilerCallback, StepTimingCallback, SystemMetricsCallback, ThroughputCallback
from .config import ConfigError, ProfilerConfig
from .session import ProfilerSession

try:
    __version__ = version("anemoi-profiler")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "ConfigError",
    "ProfilerCallback",
    "ProfilerConfig",
    "ProfilerSession",
    "StepTimingCallback",
    "SystemMetricsCallback",
    "ThroughputCallback",
    "__version__",
    "build_callbacks",
]
