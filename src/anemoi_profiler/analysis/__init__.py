"""Holistic Trace Analysis (HTA) over the profiler's trace folders, for the CLI, callbacks and notebooks.

Importing this package imports neither HTA nor torch: HTA is an optional dependency (`anemoi-profiler[hta]`)
and runs in a child process (`hta_worker`). `preflight` checks the files first, `hta_runner` runs the
analyses the traces support within a time limit and writes `summary.json`, `summary_text` says it on the console.
"""

from __future__ import annotations

from anemoi_profiler.analysis.hta_runner import (
    HtaNotInstalledError,
    analyze,
    analyze_window,
    plan_analyses,
)
from anemoi_profiler.analysis.preflight import (
    NoTracesError,
    TraceError,
    WindowCheck,
    check_window,
    find_window_dirs,
)
from anemoi_profiler.analysis.summary_text import format_summary

__all__ = [
    "HtaNotInstalledError",
    "NoTracesError",
    "TraceError",
    "WindowCheck",
    "analyze",
    "analyze_window",
    "check_window",
    "find_window_dirs",
    "format_summary",
    "plan_analyses",
]
