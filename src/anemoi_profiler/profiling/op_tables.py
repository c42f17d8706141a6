"""Operator time and memory tables built from `prof.key_averages()` objects, never from printed tables.

torch reports times in microseconds and memory in bytes per operator, summed over every call in the
window. Here they become rows in milliseconds and megabytes (decimal, like MLflow's system metrics).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from anemoi_profiler.report_sections import MB

US_PER_MS = 1000.0
STEP_MARKER = "ProfilerStep*"
"""key_averages' row for the whole profiler step; it is every operator at once, so it is left out."""

MEMORY_EXPLANATION = """\
How to read this table:
- Values are net allocations (bytes allocated minus bytes freed) in MB, summed over all calls and all
  profiled steps of the window, so they can add up to more than the device's memory.
- "self" counts what the operator itself allocated; "total" adds the operators it called.
- Negative values are frees: memory released by the operator (e.g. activations freed in backward).
- This is not the peak. For the peak look at memory/peak_allocated_mb (MLflow), the per-step peaks of the
  profiled steps (torch.cuda.max_memory_allocated) or a memory snapshot (memory/snapshot_rank<r>.pickle,
  open at pytorch.org/memory_viz)."""


def _number(event: Any, *names: str) -> float:
    """The first attribute present: torch renamed cuda_* to device_* in 2.4, older versions lack the new names."""
    for name in names:
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


@dataclass(frozen=True)
class OperatorStats:
    """One operator of one window: times in ms, memory in MB, summed over its calls."""

    name: str
    calls: int
    self_cpu_ms: float
    cpu_total_ms: float
    self_device_ms: float
    device_total_ms: float
    self_cpu_memory_mb: float
    cpu_memory_mb: float
    self_device_memory_mb: float
    device_memory_mb: float
    flops: float

    @classmethod
    def from_event(cls, event: Any) -> OperatorStats:
        return cls(
            name=str(event.key),
            calls=int(event.count),
            self_cpu_ms=_number(event, "self_cpu_time_total") / US_PER_MS,
            cpu_total_ms=_number(event, "cpu_time_total") / US_PER_MS,
            self_device_ms=_number(event, "self_device_time_total", "self_cuda_time_total") / US_PER_MS,
            device_total_ms=_number(event, "device_time_total", "cuda_time_total") / US_PER_MS,
            self_cpu_memory_mb=_number(event, "self_cpu_memory_usage") / MB,
            cpu_memory_mb=_number(event, "cpu_memory_usage") / MB,
            self_device_memory_mb=_number(event, "self_device_memory_usage", "self_cuda_memory_usage") / MB,
            device_memory_mb=_number(event, "device_memory_usage", "cuda_memory_usage") / MB,
            flops=_number(event, "flops"),
        )

    def plus(self, other: OperatorStats) -> OperatorStats:
        """The same operator over two windows."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "name"}
        return OperatorStats(name=self.name, **summed)


def operator_stats(events: Iterable[Any]) -> list[OperatorStats]:
    """Rows from `prof.key_averages()`."""
    return [OperatorStats.from_event(event) for event in events if event.key != STEP_MARKER]


@dataclass
class WindowOperators:
    """The operators of one profiling window of one stage."""

    stage: str
    window: int
    steps: int
    operators: list[OperatorStats]

    @property
    def has_device(self) -> bool:
        return any(op.device_total_ms or op.device_memory_mb for op in self.operators)


def merge_windows(windows: Iterable[WindowOperators]) -> list[OperatorStats]:
    """Each operator summed over several windows (for the stage-level report)."""
    merged: dict[str, OperatorStats] = {}
    for window in windows:
        for op in window.operators:
            merged[op.name] = merged[op.name].plus(op) if op.name in merged else op
    return list(merged.values())


def top_by_time(operators: list[OperatorStats], top_n: int, device: bool) -> list[OperatorStats]:
    """The `top_n` operators by each of self and total CPU (and device) time, together, busiest first.

    A union rather than one ranking, so that an operator high in any of them (e.g. `aten::linear`, small
    self time, large total) is in the table; sort the CSV by the column you care about.
    """
    keys = ["self_cpu_ms", "cpu_total_ms"] + (["self_device_ms", "device_total_ms"] if device else [])
    chosen: dict[str, OperatorStats] = {}
    for key in keys:
        for op in sorted(operators, key=lambda o: getattr(o, key), reverse=True)[:top_n]:
            chosen[op.name] = op
    primary = "self_device_ms" if device else "self_cpu_ms"
    return sorted(chosen.values(), key=lambda o: (getattr(o, primary), o.self_cpu_ms), reverse=True)


def top_by_memory(operators: list[OperatorStats], top_n: int, device: bool) -> list[OperatorStats]:
    """The `top_n` operators moving the most memory (allocations or frees) on the device, or the CPU."""
    key = "self_device_memory_mb" if device else "self_cpu_memory_mb"
    moving = [op for op in operators if getattr(op, key) or getattr(op, key.replace("self_", ""))]
    return sorted(moving, key=lambda o: abs(getattr(o, key)), reverse=True)[:top_n]


def time_row(op: OperatorStats) -> dict[str, Any]:
    calls = max(op.calls, 1)
    milliseconds = {
        "self_cpu_ms": op.self_cpu_ms,
        "cpu_total_ms": op.cpu_total_ms,
        "cpu_avg_ms": op.cpu_total_ms / calls,
        "self_device_ms": op.self_device_ms,
        "device_total_ms": op.device_total_ms,
        "device_avg_ms": op.device_total_ms / calls,
    }
    return {
        "operator": op.name,
        "calls": op.calls,
        **{key: round(value, 4) for key, value in milliseconds.items()},  # 0.1 us: the profiler's resolution
        "flops": op.flops,
    }


def memory_row(op: OperatorStats) -> dict[str, Any]:
    megabytes = {
        "self_device_mb": op.self_device_memory_mb,
        "device_total_mb": op.device_memory_mb,
        "self_cpu_mb": op.self_cpu_memory_mb,
        "cpu_total_mb": op.cpu_memory_mb,
    }
    return {"operator": op.name, "calls": op.calls, **{key: round(value, 6) for key, value in megabytes.items()}}
