"""anemoi-profiler: how fast, memory-hungry and balanced Lightning training is, in MLflow and HTA.

Names are imported on first use, so `anemoi-profiler analyze` or `sync` do not pay for importing Lightning.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("anemoi-profiler")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

_EXPORTS = {
    "ConfigError": "config",
    "ProfilerConfig": "config",
    "ProfilerSession": "run.session",
    "build_callbacks": "build",
    "HtaCallback": "callbacks",
    "MemorySnapshotCallback": "callbacks",
    "ModelSummaryCallback": "callbacks",
    "ProfilerCallback": "callbacks",
    "StepTimingCallback": "callbacks",
    "SystemMetricsCallback": "callbacks",
    "ThroughputCallback": "callbacks",
    "TorchProfilerCallback": "callbacks",
    "profile_component": "component",
    "wait_for_mlflow": "tracking.deliveries",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'anemoi_profiler' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
