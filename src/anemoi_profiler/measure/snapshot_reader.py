"""Read a CUDA caching-allocator snapshot (`torch.cuda.memory._dump_snapshot`) and summarize it in numbers.

pytorch.org/memory_viz shows a snapshot as pictures; the report, the CLI and notebooks need a few figures:
how much the allocator reserved and handed out, the largest allocations and where they came from, and the
peak reached during the recorded history. Works without a GPU and without torch.
"""

from __future__ import annotations

import gzip
import pickle
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TOP_N = 10
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\(")


class _PlainDataUnpickler(pickle.Unpickler):
    """Snapshots hold only dicts, lists, tuples, numbers and strings; refusing every class makes loading safe."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a memory snapshot holds plain data only, found a reference to {module}.{name}")


SEGMENT_KEYS = frozenset({"total_size", "blocks"})


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Load a `.pickle` or `.pickle.gz` snapshot; raise ValueError if the file is not one."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as file:
            snapshot = _PlainDataUnpickler(file).load()
    except (pickle.UnpicklingError, EOFError, gzip.BadGzipFile, ValueError, OverflowError, MemoryError) as error:
        raise ValueError(f"{path}: not a CUDA memory snapshot: {type(error).__name__}: {error}") from None
    segments = snapshot.get("segments") if isinstance(snapshot, dict) else None
    well_formed = isinstance(segments, list) and all(
        isinstance(segment, dict) and segment.keys() >= SEGMENT_KEYS for segment in segments
    )
    if not well_formed:
        raise ValueError(f"{path}: not a CUDA memory snapshot (expected 'segments' with {sorted(SEGMENT_KEYS)})")
    return snapshot


def summarize_snapshot(snapshot: dict[str, Any], top_n: int = TOP_N) -> dict[str, Any]:
    """Totals over all devices in the snapshot; byte counts are exact, `where` is the allocating source line.

    `reserved_bytes` is what the allocator holds from CUDA (segments), `allocated_bytes` what tensors use at
    dump time; the difference is cached free memory (fragmentation shows as many small inactive blocks).
    `peak_allocated_bytes` is the highest allocated total reached during the recorded history, replayed from
    the trace backwards from the dump-time state; None without history.
    """
    segments = snapshot.get("segments", [])
    traces: list[list[dict[str, Any]]] = snapshot.get("device_traces", [])
    blocks = [block for segment in segments for block in segment.get("blocks", [])]
    live = [block for block in blocks if block.get("state") == "active_allocated"]
    entries = [entry for trace in traces for entry in trace]
    ooms = [entry for entry in entries if entry.get("action") == "oom"]
    summary: dict[str, Any] = {
        "devices": sorted({segment.get("device", 0) for segment in segments}),
        "segments": len(segments),
        "segments_by_type": dict(Counter(segment.get("segment_type", "unknown") for segment in segments)),
        "reserved_bytes": sum(segment["total_size"] for segment in segments),
        "allocated_bytes": sum(segment["allocated_size"] for segment in segments),
        "live_allocations": len(live),
        "inactive_blocks": sum(1 for block in blocks if block.get("state") == "inactive"),
        "largest_live_allocations": _largest(live, "size", top_n),
        "trace_entries": len(entries),
        "trace_actions": dict(Counter(entry.get("action", "unknown") for entry in entries)),
        "largest_recorded_allocations": _largest(
            (entry for entry in entries if entry.get("action") == "alloc"), "size", top_n
        ),
        "peak_allocated_bytes": _peak_allocated(segments, traces),
        "ooms": len(ooms),
    }
    if ooms:
        summary["last_oom"] = {
            "requested_bytes": ooms[-1].get("size"),
            "device_free_bytes": ooms[-1].get("device_free"),
            "where": where_allocated(ooms[-1].get("frames", [])),
        }
    return summary


def where_allocated(frames: list[dict[str, Any]]) -> str:
    """The innermost Python frame, plus the first one outside torch when that differs (usually the user's line)."""
    python = [frame for frame in frames if str(frame.get("filename", "")).endswith(".py")]
    if not python:
        # Backward runs on autograd's C++ threads: the graph node names the operation instead.
        nodes = (_AUTOGRAD_NODE.search(str(frame.get("name", ""))) for frame in frames)
        node = next((match.group(1) for match in nodes if match), None)
        return f"backward of {node}" if node else "unknown (no Python stack recorded)"
    innermost = _format_frame(python[0])
    caller = next((frame for frame in python if "/torch/" not in frame["filename"]), None)
    if caller is None or caller is python[0]:
        return innermost
    return f"{innermost} <- {_format_frame(caller)}"


def _format_frame(frame: dict[str, Any]) -> str:
    filename = str(frame["filename"]).rsplit("site-packages/", 1)[-1]
    return f"{filename}:{frame.get('line', '?')} {frame.get('name', '?')}"


def _largest(items: Iterable[dict[str, Any]], size_key: str, top_n: int) -> list[dict[str, Any]]:
    ordered = sorted(items, key=lambda item: item.get(size_key, 0), reverse=True)[:top_n]
    return [{"bytes": item.get(size_key, 0), "where": where_allocated(item.get("frames", []))} for item in ordered]


def _peak_allocated(segments: list[dict[str, Any]], traces: list[list[dict[str, Any]]]) -> int | None:
    """Replay each device's trace from its start state (dump-time allocated minus the trace's net change).

    `free_requested` is when the allocated counter drops (as in `torch.cuda.max_memory_allocated`); memory
    awaiting other streams is freed later (`free_completed`) but is no longer counted as allocated.
    """
    peaks = []
    for device, trace in enumerate(traces):
        if not trace:
            continue
        allocated_at_dump = sum(s["allocated_size"] for s in segments if s.get("device", 0) == device)
        running = peak = 0
        for entry in trace:
            if entry.get("action") == "alloc":
                running += entry["size"]
                peak = max(peak, running)
            elif entry.get("action") == "free_requested":
                running -= entry["size"]
        peaks.append(allocated_at_dump - running + peak)
    return max(peaks) if peaks else None
