"""One profiled window summarised in fixed size: HTA's temporal, idle-time, overlap and kernel answers, one sweep.

The same figures on every rank, in the same units, whatever the window held: a window without device work has
its device figures NaN ("not assessed") and still its host figures. Definitions follow HTA's
(`hta/analyzers/breakdown_analysis.py`, `communication_analysis.py`, `cuda_kernel_analysis.py`), so the two
agree (docs/hta.md); each is computed with sorts and cumulative maxima over columns, never a DataFrame.
Torch-free: `anemoi-profiler summarize` runs it over saved traces.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from anemoi_profiler.profiling.kernel_kinds import (
    COMMUNICATION,
    COMPUTE,
    MEMORY,
    OTHER,
    RULE_NAMES,
    classify_device,
    is_host_collective,
)
from anemoi_profiler.profiling.window_events import DEVICE, HOST, LAUNCH, STEP, WindowEvents

KERNEL_WAIT_US = 30.0
"""HTA's `consecutive_kernel_delay` default: a gap on a stream shorter than this, with the next kernel already
launched, is the cost of launching back-to-back kernels ("kernel wait")."""
TOP_KERNELS = 10
_CHUNK = 1 << 18

FIELDS: tuple[tuple[str, str], ...] = (
    ("window_ms", "first step's start to last step's end (all events without steps)"),
    ("steps", "ProfilerStep annotations in the window"),
    ("step_ms", "window_ms / steps"),
    ("host_busy_pct", "host ops and annotations (union over threads), % of window"),
    ("launches", "kernel launch calls"),
    ("launch_ms", "time in launch calls, summed"),
    ("host_collective_ms", "host collectives (gloo:, nccl: annotations), union"),
    ("host_collective_pct", "host_collective_ms, % of window"),
    ("device_events", "kernels, memcpys and memsets"),
    ("streams", "device streams used"),
    ("device_span_ms", "first device event's start to last one's end (HTA's kernel_time)"),
    ("active_ms", "union of all device events"),
    ("idle_ms", "device_span_ms - active_ms"),
    ("idle_pct", "idle_ms, % of device span (HTA's idle_time_pctg)"),
    ("compute_ms", "union of compute kernels"),
    ("compute_pct", "% of device span (HTA's compute_time_pctg)"),
    ("non_compute_pct", "device span - compute - idle, % (HTA's non_compute_time_pctg)"),
    ("communication_ms", "union of communication kernels"),
    ("communication_pct", "% of device span"),
    ("memory_ms", "union of memcpy and memset"),
    ("memory_pct", "% of device span"),
    ("overlap_ms", "communication ∩ compute"),
    ("overlap_pct", "overlap_ms, % of communication_ms (HTA's comp_comm_overlap_pctg)"),
    ("exposed_communication_ms", "communication_ms - overlap_ms: communication nothing hides"),
    ("exposed_communication_pct", "% of device span"),
    ("kernel_ms", "union of compute, communication and memory kernels (HTA's kernel type breakdown, all of it)"),
    ("computation_only_pct", "compute with no communication or memory running, % of kernel_ms (HTA's COMPUTATION)"),
    ("communication_only_pct", "communication with no compute or memory running, % of kernel_ms (HTA's COMMUNICATION)"),
    ("memory_only_pct", "memcpy/memset with no compute or communication running, % of kernel_ms (HTA's MEMORY)"),
    ("idle_host_wait_ms", "stream gaps before a kernel launched after its predecessor ended, summed over streams"),
    ("idle_kernel_wait_ms", "other stream gaps under 30 us: launch overhead (HTA's rule)"),
    ("idle_other_ms", "remaining stream gaps (synchronisation, dependencies)"),
    ("idle_host_wait_pct", "idle_host_wait_ms, % of the three (HTA's idle_time_ratio, over all streams)"),
    ("idle_kernel_wait_pct", "idle_kernel_wait_ms, % of the three"),
    ("idle_other_pct", "idle_other_ms, % of the three"),
    ("launch_delay_p50_us", "kernel start - launch call's end, median (HTA's launch_delay)"),
    ("launch_delay_p95_us", "the same, 95th percentile"),
    ("top_kernels_share_pct", "share of the top 10 kernels in summed device time"),
)
FIELD_NAMES = tuple(name for name, _ in FIELDS)
TOP_FIELDS = ("hash", "count", "total_ms", "share_pct")
RULE_FIELDS = (*(f"rule_{rule}_events" for rule in RULE_NAMES), "rule_host_collective_events")
VECTOR_LENGTH = len(FIELDS) + TOP_KERNELS * len(TOP_FIELDS) + len(RULE_FIELDS)
"""Numbers per rank in the exchange: the same on every rank, whatever its window held."""


def name_hash(name: str) -> float:
    """A kernel name as a 48-bit integer, exact in a float64, so the exchange carries names as numbers."""
    return float(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=6).digest(), "big"))


@dataclass(frozen=True)
class TopKernel:
    name: str
    count: int
    total_ms: float
    share_pct: float


@dataclass
class WindowSummary:
    """The figures of one rank's window (`values`, NaN = not assessed), its top kernels and rule counts."""

    values: dict[str, float]
    top_kernels: list[TopKernel] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)
    step: int | None = None
    """The trainer's global step after the window's last batch (the step its MLflow figures go at); None: unknown."""

    @property
    def device_assessed(self) -> bool:
        return not math.isnan(self.values["device_span_ms"])

    def vector(self) -> np.ndarray:
        """The fixed-length float64 vector every rank exchanges (kernel names as `name_hash`)."""
        out = np.full(VECTOR_LENGTH, np.nan)
        out[: len(FIELDS)] = [self.values[name] for name in FIELD_NAMES]
        for slot, kernel in enumerate(self.top_kernels[:TOP_KERNELS]):
            at = len(FIELDS) + slot * len(TOP_FIELDS)
            out[at : at + len(TOP_FIELDS)] = (name_hash(kernel.name), kernel.count, kernel.total_ms, kernel.share_pct)
        at = len(FIELDS) + TOP_KERNELS * len(TOP_FIELDS)
        out[at:] = [self.rules.get(name, 0) for name in RULE_FIELDS]
        return out

    def name_table(self) -> dict[str, str]:
        """Hash -> name of this rank's top kernels: what a reader of the exchanged vectors needs."""
        return {f"{name_hash(kernel.name):.0f}": kernel.name for kernel in self.top_kernels}


def union_us(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of intervals (touching ones merge, as in HTA's `merge_kernel_intervals`)."""
    return _union_sorting_in_place(start.copy(), end.copy())


def _union_sorting_in_place(starts: np.ndarray, ends: np.ndarray) -> float:
    """The union from starts and ends sorted separately, in place: no index array, no reordered copies.

    Coverage drops to zero right after the j-th end exactly when j + 1 starts came at or before it, and rises
    from zero at the i-th start when exactly i ends came strictly before it: the union is the sum of those
    ends minus the sum of those starts.
    """
    if len(starts) == 0:
        return 0.0
    starts.sort()
    ends.sort()
    origin = starts[0]  # sums of epoch-scale timestamps (1e15 us) would cancel away whole microseconds
    total = 0.0
    for at in range(0, len(starts), _CHUNK):  # chunks keep the searchsorted results small
        rank = np.arange(at, min(at + _CHUNK, len(starts)))
        chunk_ends, chunk_starts = ends[rank], starts[rank]
        closing = chunk_ends[np.searchsorted(starts, chunk_ends, side="right") == rank + 1]
        opening = chunk_starts[np.searchsorted(ends, chunk_starts, side="left") == rank]
        total += (closing - origin).sum() - (opening - origin).sum()
    return float(total)


def _host_union_us(events: WindowEvents, chosen: np.ndarray, window_start: float, window_end: float) -> float:
    """Union of the chosen host events cut to the window, building only the two arrays it sorts."""
    starts = events.start_us[chosen]
    ends = events.dur_us[chosen]
    ends += starts
    np.clip(starts, window_start, window_end, out=starts)
    np.clip(ends, window_start, window_end, out=ends)
    return _union_sorting_in_place(starts, ends)


def _window_bounds(events: WindowEvents) -> tuple[float, float, int]:
    steps = events.kind == STEP
    chosen = steps if steps.any() else np.ones(len(events), dtype=bool)
    if not chosen.any():
        return 0.0, 0.0, 0
    start, end = events.start_us[chosen], events.start_us[chosen] + events.dur_us[chosen]
    return float(start.min()), float(end.max()), int(steps.sum())


def _launch_lookup(events: WindowEvents, window_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Launch calls up to the window's end, sorted by correlation id: (ids, starts, ends)."""
    launches = (events.kind == LAUNCH) & (events.correlation >= 0) & (events.start_us <= window_end)
    order = np.argsort(events.correlation[launches], kind="stable")
    starts = events.start_us[launches][order]
    return events.correlation[launches][order], starts, starts + events.dur_us[launches][order]


def _match(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index into sorted `ids` of each `wanted` id, -1 where absent."""
    if len(ids) == 0:
        return np.full(len(wanted), -1)
    at = np.clip(np.searchsorted(ids, wanted), 0, len(ids) - 1)
    return np.where(ids[at] == wanted, at, -1)


def _idle_breakdown(stream: np.ndarray, start: np.ndarray, end: np.ndarray, launched: np.ndarray) -> np.ndarray:
    """HTA's idle split, summed over streams: gaps between consecutive events of a stream (by start) are host
    wait when the next one was launched after the previous one ended, else kernel wait under 30 us, else other."""
    order = np.lexsort((start, stream))
    stream, start, end, launched = stream[order], start[order], end[order], launched[order]
    same = stream[1:] == stream[:-1]
    gap = (start[1:] - end[:-1])[same]
    host_wait = (launched[1:] > end[:-1])[same]  # NaN (no launch found) compares False
    kernel_wait = ~host_wait & (gap < KERNEL_WAIT_US)
    return np.array([gap[host_wait].sum(), gap[kernel_wait].sum(), gap[~host_wait & ~kernel_wait].sum()])


def _top_kernels(names: list[str], name_id: np.ndarray, dur: np.ndarray) -> tuple[list[TopKernel], float]:
    totals = np.bincount(name_id, weights=dur, minlength=len(names))
    counts = np.bincount(name_id, minlength=len(names))
    whole = float(dur.sum())
    top = [int(i) for i in np.argsort(-totals, kind="stable")[:TOP_KERNELS] if counts[i] > 0]
    kernels = [TopKernel(names[i], int(counts[i]), totals[i] / 1e3, 100 * totals[i] / whole) for i in top]
    return kernels, sum(kernel.share_pct for kernel in kernels)


def _kind_breakdown(
    kind: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    active: float,
    unions: tuple[float, float, float],
    compute_or_communication: float,
) -> tuple[float, tuple[float, float, float]]:
    """HTA's kernel type breakdown: the union of compute, communication and memory kernels, and the time each of
    the three runs alone in it (the union minus the union of the other two); unions of empty kinds are not sorted.
    """
    compute, communication, memory = unions
    other = kind == OTHER
    kernel = active if not other.any() else _union_sorting_in_place(start[~other], end[~other])
    if memory == 0:
        return kernel, (kernel - communication, kernel - compute, 0.0)
    with_memory = [(kind == chosen) | (kind == MEMORY) for chosen in (COMPUTE, COMMUNICATION)]
    compute_or_memory, communication_or_memory = (_union_sorting_in_place(start[m], end[m]) for m in with_memory)
    return kernel, (kernel - communication_or_memory, kernel - compute_or_memory, kernel - compute_or_communication)


def summarize(events: WindowEvents) -> WindowSummary:
    """The window's figures (see `FIELDS`) from its events in one pass of sorts and cumulative sums."""
    window_start, window_end, steps = _window_bounds(events)
    window_us = window_end - window_start
    values = dict.fromkeys(FIELD_NAMES, math.nan)
    is_collective = np.array([is_host_collective(name) for name in events.names], dtype=bool)
    launch = events.kind == LAUNCH
    collective = (events.kind == HOST) & is_collective[events.name_id]
    host = events.kind == HOST  # launch calls run inside the ops that issue them: no need to sort them too
    # host time counts inside the window only: a collective that began before the first step is cut there
    host_collective_us = _host_union_us(events, collective, window_start, window_end)
    host_busy_us = _host_union_us(events, host, window_start, window_end)
    values.update(
        window_ms=window_us / 1e3,
        steps=float(steps),
        step_ms=window_us / 1e3 / steps if steps else math.nan,
        host_busy_pct=100 * host_busy_us / window_us if window_us > 0 else math.nan,
        launches=float(launch.sum()),
        launch_ms=float(events.dur_us[launch].sum()) / 1e3,
        host_collective_ms=host_collective_us / 1e3,
        host_collective_pct=100 * host_collective_us / window_us if window_us > 0 else math.nan,
    )
    rules = {"rule_host_collective_events": int(collective.sum())}
    device = events.kind == DEVICE
    ids, launch_start, launch_end = _launch_lookup(events, window_end)
    match = _match(ids, events.correlation[device])
    if len(ids):  # as HTA: device work counts when a launch inside the window issued it
        device[np.flatnonzero(device)[match < 0]] = False
        match = match[match >= 0]
    if not device.any():
        return WindowSummary(values, [], rules)

    name_id, start, dur = events.name_id[device], events.start_us[device], events.dur_us[device]
    stream = events.stream[device]
    end = start + dur
    classes = [classify_device(name) for name in events.names]
    kind_of_name = np.array([kind for kind, _ in classes], dtype=np.int8)
    rule_counts = np.bincount(np.array([rule for _, rule in classes])[name_id], minlength=len(RULE_NAMES))
    rules.update({f"rule_{rule}_events": int(n) for rule, n in zip(RULE_NAMES, rule_counts, strict=True)})
    kind = kind_of_name[name_id]
    span = float(end.max() - start.min())
    active = _union_sorting_in_place(start.copy(), end.copy())
    compute = _union_sorting_in_place(start[kind == COMPUTE], end[kind == COMPUTE])
    communication = _union_sorting_in_place(start[kind == COMMUNICATION], end[kind == COMMUNICATION])
    memory = _union_sorting_in_place(start[kind == MEMORY], end[kind == MEMORY])
    both = (kind == COMPUTE) | (kind == COMMUNICATION)
    compute_or_communication = _union_sorting_in_place(start[both], end[both])
    overlap = compute + communication - compute_or_communication
    unions = (compute, communication, memory)
    kernel, alone = _kind_breakdown(kind, start, end, active, unions, compute_or_communication)
    launched = np.full(len(start), np.nan)
    if len(ids):
        launched = launch_start[match]
    idle_split = _idle_breakdown(stream, start, end, launched)
    stream_idle = float(idle_split.sum())
    delays = np.clip(start - launch_end[match], 0, None) if len(ids) else np.empty(0)
    top, top_share = _top_kernels(events.names, name_id, dur)

    def pct(us: float) -> float:
        return 100 * us / span if span > 0 else math.nan

    values.update(
        device_events=float(device.sum()),
        streams=float(len(np.unique(stream))),
        device_span_ms=span / 1e3,
        active_ms=active / 1e3,
        idle_ms=(span - active) / 1e3,
        idle_pct=pct(span - active),
        compute_ms=compute / 1e3,
        compute_pct=pct(compute),
        non_compute_pct=pct(active - compute),
        communication_ms=communication / 1e3,
        communication_pct=pct(communication),
        memory_ms=memory / 1e3,
        memory_pct=pct(memory),
        overlap_ms=overlap / 1e3,
        overlap_pct=100 * overlap / communication if communication > 0 else math.nan,
        exposed_communication_ms=(communication - overlap) / 1e3,
        exposed_communication_pct=pct(communication - overlap),
        kernel_ms=kernel / 1e3,
        computation_only_pct=100 * alone[0] / kernel if kernel > 0 else math.nan,
        communication_only_pct=100 * alone[1] / kernel if kernel > 0 else math.nan,
        memory_only_pct=100 * alone[2] / kernel if kernel > 0 else math.nan,
        idle_host_wait_ms=idle_split[0] / 1e3,
        idle_kernel_wait_ms=idle_split[1] / 1e3,
        idle_other_ms=idle_split[2] / 1e3,
        idle_host_wait_pct=100 * idle_split[0] / stream_idle if stream_idle else math.nan,
        idle_kernel_wait_pct=100 * idle_split[1] / stream_idle if stream_idle else math.nan,
        idle_other_pct=100 * idle_split[2] / stream_idle if stream_idle else math.nan,
        launch_delay_p50_us=float(np.percentile(delays, 50)) if len(delays) else math.nan,
        launch_delay_p95_us=float(np.percentile(delays, 95)) if len(delays) else math.nan,
        top_kernels_share_pct=top_share,
    )
    return WindowSummary(values, top, rules)
