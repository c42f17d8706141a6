"""A finished window's events straight from torch.profiler's results: no trace file written or parsed."""

from __future__ import annotations

from typing import Any

from .window_events import (
    CPU_OP,
    DEVICE_CATEGORIES,
    HOST,
    HOST_CATEGORIES,
    LAUNCH_CATEGORIES,
    WindowEvents,
    WindowEventsBuilder,
)

_READ = DEVICE_CATEGORIES | LAUNCH_CATEGORIES | HOST_CATEGORIES


def window_events_from_kineto(results: Any) -> WindowEvents:
    """Columns from `prof.profiler.kineto_results` (torch's `_ProfilerResult`), as a trace file would give them.

    Kineto names each event's activity as the trace's `cat` (`kernel`, `cuda_runtime`, `cpu_op`, ...); device
    events carry their stream as `device_resource_id` and share the launch's CUPTI `correlation_id` (0: none).
    About 4 us of Python per event read (docs/hta.md), so the caller runs it off the training thread.
    """
    builder = WindowEventsBuilder()
    add, add_op = builder.add_categorised, builder.add
    for event in results.events():
        category = event.activity_type()
        if category == CPU_OP:  # half the events: their times only (see `CPU_OP`)
            add_op(CPU_OP, HOST, event.start_ns() / 1e3, event.duration_ns() / 1e3)
            continue
        if category not in _READ:  # memory instants ([memory], with profile_memory) and the like: skipped unread
            continue
        add(
            category,
            event.name(),
            event.start_ns() / 1e3,
            event.duration_ns() / 1e3,
            event.device_resource_id(),
            event.correlation_id() or -1,
        )
    return builder.build()
