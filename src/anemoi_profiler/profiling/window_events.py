"""One profiled window's events as compact columns: what the summary sweeps, from kineto's results or a trace file.

A name is stored once (`names`) and referenced by index, so a window of millions of events with a few thousand
distinct names costs about 30 bytes an event instead of a Python object apiece. Torch-free: `summarize` builds it from a
saved Chrome trace, the profiler from its own events.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

HOST, STEP, LAUNCH, DEVICE = 0, 1, 2, 3
"""Event kinds: a host op or annotation, a `ProfilerStep#<n>` annotation, a kernel launch (CUDA/HIP runtime or
driver call that names a correlation id), and work on a device stream (kernel, memcpy, memset)."""

STEP_PREFIX = "ProfilerStep#"
DEVICE_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
"""Chrome-trace categories of device work, as HTA's idle-time analysis lists them."""
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"})
CPU_OP = "cpu_op"
"""Operators are kept under this one name: the summary reads only their times (steps and host collectives are
annotations), and the in-process reader then skips building a name string for half of all events."""


@dataclass(frozen=True)
class WindowEvents:
    """Columns of equal length; times in microseconds on one clock; `stream` -1 and `correlation` -1 when absent."""

    names: list[str]
    name_id: np.ndarray
    kind: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)


class WindowEventsBuilder:
    """Collects events one at a time into typed arrays (no per-event Python object kept), then `build()`s once."""

    def __init__(self) -> None:
        self._name_ids: dict[str, int] = {}
        self._name_id = array("i")
        self._kind = array("b")
        self._start = array("d")
        self._dur = array("d")
        self._stream = array("i")
        self._correlation = array("q")

    def add(self, name: str, kind: int, start_us: float, dur_us: float, stream: int = -1, correlation: int = -1):
        name_id = self._name_ids.get(name)
        if name_id is None:
            name_id = self._name_ids[name] = len(self._name_ids)
        self._name_id.append(name_id)
        self._kind.append(kind)
        self._start.append(start_us)
        self._dur.append(dur_us)
        self._stream.append(stream)
        self._correlation.append(correlation)

    def add_chrome_event(self, event: dict) -> None:
        """One Chrome-trace event: complete ('X') events of the categories the summary reads; others ignored."""
        if event.get("ph") != "X":
            return
        args = event.get("args") or {}
        self.add_categorised(
            str(event.get("cat")),
            str(event.get("name", "")),
            float(event["ts"]),
            float(event.get("dur", 0.0)),
            int(args.get("stream", 0)),
            int(args.get("correlation", -1)),
        )

    def add_categorised(
        self, category: str, name: str, start_us: float, dur_us: float, stream: int, correlation: int
    ) -> None:
        """An event by its kineto category (Chrome's `cat`); categories the summary does not read are ignored."""
        if category in DEVICE_CATEGORIES:
            self.add(name, DEVICE, start_us, dur_us, stream, correlation)
        elif category in LAUNCH_CATEGORIES and correlation > 0:
            self.add(name, LAUNCH, start_us, dur_us, -1, correlation)
        elif category == CPU_OP:
            self.add(CPU_OP, HOST, start_us, dur_us)
        elif category in HOST_CATEGORIES:
            self.add(name, STEP if name.startswith(STEP_PREFIX) else HOST, start_us, dur_us)

    def build(self) -> WindowEvents:
        names = [""] * len(self._name_ids)
        for name, index in self._name_ids.items():
            names[index] = name

        # views on the arrays collected, not copies: the builder is done with them (a large window's columns
        # are held once); an empty array has no buffer to view
        def column(values: array, dtype: type) -> np.ndarray:
            return np.frombuffer(values, dtype=dtype) if len(values) else np.empty(0, dtype=dtype)

        return WindowEvents(
            names=names,
            name_id=column(self._name_id, np.int32),
            kind=column(self._kind, np.int8),
            start_us=column(self._start, np.float64),
            dur_us=column(self._dur, np.float64),
            stream=column(self._stream, np.int32),
            correlation=column(self._correlation, np.int64),
        )
