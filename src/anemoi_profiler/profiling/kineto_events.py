"""A finished window's events straight from torch.profiler's results: no trace file written or parsed.

torch hands a window's events to Python only as a list of `_KinetoEvent` objects (`_ProfilerResult.events()`:
no columnar or batched accessor exists): a Python object per event before anything is read. What this module
adds to that floor is kept small: each field is read with `map` over the unbound accessor straight into
a numpy array (`np.fromiter`: no Python loop, no per-event Python number kept), and only the fields the sweep
needs: every event's category, start and duration; the name of annotations and device work only (operators
are timed, not named: see `CPU_OP`; launch calls need only their correlation id); the stream of device work.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from itertools import compress, repeat
from pathlib import Path
from typing import Any

import numpy as np

from anemoi_profiler.profiling.torch_private import kineto_events_have_activity_type
from anemoi_profiler.profiling.trace_stream import read_window_events
from anemoi_profiler.profiling.window_events import (
    CPU_OP,
    DEVICE,
    DEVICE_CATEGORIES,
    HOST,
    HOST_CATEGORIES,
    LAUNCH,
    LAUNCH_CATEGORIES,
    STEP,
    STEP_PREFIX,
    WindowEvents,
)

LAUNCH_NAME = "launch"
"""Launch calls are matched by correlation id only: one name for all of them spares reading theirs."""
_SKIPPED = -1
_NAMED = -2  # annotations: STEP or HOST, decided by name
_KIND_OF_CATEGORY = {
    **dict.fromkeys(DEVICE_CATEGORIES, DEVICE),
    **dict.fromkeys(LAUNCH_CATEGORIES, LAUNCH),
    **dict.fromkeys(HOST_CATEGORIES, _NAMED),
    CPU_OP: HOST,
}


def window_events_from_kineto(results: Any) -> WindowEvents:
    """Columns from `prof.profiler.kineto_results` (torch's `_ProfilerResult`), as a trace file would give them.

    Kineto names each event's activity as the trace's `cat` (`kernel`, `cuda_runtime`, `cpu_op`, ...); device
    events carry their stream as `device_resource_id` and share the launch's CUPTI `correlation_id` (0: none).
    Python work proportional to the events (docs/hta.md), so the caller runs it off the training thread.
    """
    events = results.events()
    count = len(events)
    if not count:
        return WindowEvents([], np.empty(0, np.int32), np.empty(0, np.int8), np.empty(0), np.empty(0), *_no_ids(0))
    accessor = type(events[0])
    kind = np.fromiter(
        map(_KIND_OF_CATEGORY.get, map(accessor.activity_type, events), repeat(_SKIPPED)), np.int8, count
    )
    start_us = np.fromiter(map(accessor.start_ns, events), np.int64, count) / 1e3  # epoch ns: exact as int64
    dur_us = np.fromiter(map(accessor.duration_ns, events), np.float64, count)
    dur_us /= 1e3
    stream, correlation = _no_ids(count)
    device = kind == DEVICE
    correlated = device | (kind == LAUNCH)
    ids = np.fromiter(map(accessor.correlation_id, _where(events, correlated)), np.int64)
    correlation[correlated] = np.where(ids > 0, ids, -1)
    stream[device] = np.fromiter(map(accessor.device_resource_id, _where(events, device)), np.int32)
    kind[(kind == LAUNCH) & (correlation < 0)] = _SKIPPED  # a launch without correlation id matches nothing
    index = _NameIndex({CPU_OP: 0, LAUNCH_NAME: 1})
    name_id = (kind == LAUNCH).astype(np.int32)
    named = device | (kind == _NAMED)
    name_id[named] = np.fromiter(map(index.__getitem__, map(accessor.name, _where(events, named))), np.int32)
    names = list(index)
    annotation = kind == _NAMED
    is_step = np.array([name.startswith(STEP_PREFIX) for name in names])
    kind[annotation] = np.where(is_step[name_id[annotation]], STEP, HOST)
    columns = (name_id, kind, start_us, dur_us, stream, correlation)
    keep = kind != _SKIPPED  # memory instants ([memory], with profile_memory) and the like
    if not keep.all():
        columns = tuple(column[keep] for column in columns)
    return WindowEvents(names, *columns)


def reads_in_process() -> bool:
    """Whether this torch tells Python each event's activity type (`torch_private.KINETO_ACTIVITY_TYPE_FROM`).

    Before, the window is read from the Chrome trace kineto saves, which a window's results do only once: the
    trace written for the run folder where there is one (see `WindowSummaries.submit`), else a temporary file.
    """
    return kineto_events_have_activity_type()


def window_events_from_saved(results: Any) -> WindowEvents:
    """The window kineto saves as a Chrome trace (`_ProfilerResult.save`, once per window) to a temporary file,
    read back as `summarize` reads traces: for a torch without `activity_type` and a window without a trace."""
    handle, name = tempfile.mkstemp(prefix="anemoi-profiler-window-", suffix=".json")
    os.close(handle)
    try:
        results.save(name)
        return read_window_events(Path(name))
    finally:
        os.unlink(name)


class _NameIndex(dict[str, int]):
    """Name -> id, numbering a name when first seen: each event's name string is dropped once looked up."""

    def __missing__(self, name: str) -> int:
        self[name] = len(self)
        return len(self) - 1


def _where(items: list[Any], mask: np.ndarray) -> Iterator[Any]:
    """The items where `mask` is set, as an iterator (`compress`, in C): no list of them, no index objects."""
    return compress(items, mask.tolist())


def _no_ids(count: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(count, -1, np.int32), np.full(count, -1, np.int64)
