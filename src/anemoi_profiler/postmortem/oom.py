"""Out of memory: on the device (`torch.OutOfMemoryError`, CUDA's and ROCm's) and on the host (a DataLoader
worker killed by the kernel's OOM killer), recorded as `postmortem/oom_rank<r>.json`.

On CUDA, torch's out-of-memory observer (`torch._C._cuda_attach_out_of_memory_observer`, as Composer and
torchtitan use it) takes a memory snapshot at the failed allocation, while everything is still allocated; with
`postmortem.memory_history` the snapshot has every allocation's stack (a bounded history), and the record lists
the largest allocation sites. The snapshot opens at pytorch.org/memory_viz. Nothing here runs before an error.
"""

from __future__ import annotations

import json
import pickle
import re
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import torch

from anemoi_profiler.logs import get_logger
from anemoi_profiler.postmortem.stacks import describe, frames_of_traceback, phase_of, user_frame
from anemoi_profiler.profiling import torch_private
from anemoi_profiler.run_files.layout import oom_path

log = get_logger(__name__)

MB = 1024 * 1024
TOP_SITES = 10
WORKER_KILLED = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: Killed")
"""How torch says a DataLoader worker got SIGKILL, what the kernel's OOM killer sends (in the context of Lightning's
"exited unexpectedly")."""
_observed: list[dict[str, Any]] = []  # what the observer saw at the last failed allocation of this process
_observer_attached = False


def find(error: BaseException) -> tuple[str, BaseException] | None:
    """(`device`, the error) for an out-of-memory error, (`host`, the error that says so) for a DataLoader worker
    killed; None for other errors."""
    for link in _chain(error):
        if isinstance(link, torch_private.OutOfMemoryError):
            return "device", link
        if WORKER_KILLED.search(str(link)):
            return "host", link
    return None


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def start_memory_history(entries: int) -> bool:
    """CUDA: keep the last `entries` allocations with their stacks; False (said once) where torch cannot."""
    if not torch.cuda.is_available():
        return False
    try:
        torch_private.record_memory_history(entries, python_stacks_only=True)
        return True
    except Exception as error:  # ROCm builds without it, say
        log.warning("no CUDA memory history: %s: %s", type(error).__name__, error)
        return False


def attach_observer() -> None:
    """Once per process, on CUDA: a snapshot at the failed allocation itself, before the stack unwinds."""
    global _observer_attached
    if _observer_attached or not torch.cuda.is_available():
        return
    try:
        torch_private.attach_out_of_memory_observer(_on_out_of_memory)
        _observer_attached = True
    except Exception as error:  # a build without it
        log.info("no out-of-memory observer: %s: %s", type(error).__name__, error)


def _on_out_of_memory(device: int, requested: int, device_allocated: int, device_free: int) -> None:
    seen: dict[str, Any] = {
        "device": device,
        "requested_mb": requested / MB,
        "device_allocated_mb": device_allocated / MB,
        "device_free_mb": device_free / MB,
    }
    try:
        seen["snapshot"] = torch_private.memory_snapshot()
    except Exception as error:  # e.g. ROCm, where snapshots fail on some devices
        seen["snapshot_not_taken"] = f"{type(error).__name__}: {error}"
    _observed[:] = [seen]


def record(
    run_dir: Path, rank: int, step: int, batches: int, error: BaseException, found_as: tuple[str, BaseException]
) -> Path:
    """Write `oom_rank<r>.json` (and the snapshot beside it) for an error `find` recognised: where `error` went
    (the user's, as raised to Lightning), what `found_as` says."""
    kind, link = found_as
    frames = frames_of_traceback(error)
    found: dict[str, Any] = {
        "kind": kind,
        "rank": rank,
        "hostname": socket.gethostname(),
        "step": step,
        "batches_finished": batches,
        "error": f"{type(link).__name__}: {str(link).strip().splitlines()[0] if str(link).strip() else ''}",
        "phase": phase_of(frames),
        "frame": describe(user_frame(frames)),
        "traceback": frames,
        "host": host_memory(),
    }
    if kind == "device":
        found["device"] = device_memory()
        found.update(_observed_snapshot(run_dir, rank))
    path = oom_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_json(found))
    return path


def device_memory() -> dict[str, Any]:
    """Peaks against the capacity, and fragmentation: reserved but not allocated, as a share of reserved."""
    if not torch.cuda.is_available():
        return {"not_assessed": "no CUDA device"}
    stats = torch.cuda.memory_stats()
    reserved = stats.get("reserved_bytes.all.current", 0)
    allocated = stats.get("allocated_bytes.all.current", 0)
    _, total = torch.cuda.mem_get_info()
    return {
        "name": torch.cuda.get_device_name(),
        "capacity_mb": total / MB,
        "allocated_mb": allocated / MB,
        "reserved_mb": reserved / MB,
        "peak_allocated_mb": stats.get("allocated_bytes.all.peak", 0) / MB,
        "peak_reserved_mb": stats.get("reserved_bytes.all.peak", 0) / MB,
        "fragmentation": (reserved - allocated) / reserved if reserved else 0.0,
        "inactive_split_mb": stats.get("inactive_split_bytes.all.current", 0) / MB,
        "alloc_retries": stats.get("num_alloc_retries", 0),
        "rocm": torch.version.hip is not None,
    }


def _observed_snapshot(run_dir: Path, rank: int) -> dict[str, Any]:
    if not _observed:
        how = "no CUDA device" if not torch.cuda.is_available() else "the out-of-memory observer did not run"
        return {"snapshot_not_taken": how}
    seen = dict(_observed.pop())
    snapshot = seen.pop("snapshot", None)
    if snapshot is None:
        rocm = " (ROCm: memory snapshots do not work on every AMD device)" if torch.version.hip else ""
        return {"at_failed_allocation": seen, "snapshot_not_taken": seen.pop("snapshot_not_taken", "") + rocm}
    path = oom_path(run_dir, rank, ".pickle")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        pickle.dump(snapshot, file)
    return {"at_failed_allocation": seen, "snapshot": path.name, "top_allocation_sites": top_sites(snapshot)}


def top_sites(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The live blocks' bytes by the innermost frame of their allocation stack (frames need the history)."""
    sizes: Counter[str] = Counter()
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            frames = [f for f in block.get("frames", []) if not f.get("filename", "").startswith("??")]
            user = [f for f in frames if "/torch/" not in f.get("filename", "")]
            where = (user or frames or [None])[0]
            site = f"{where['name']} ({where['filename'].rsplit('/', 1)[-1]}:{where['line']})" if where else "unknown"
            sizes[site] += block.get("size", 0)
    return [{"site": site, "mb": size / MB} for site, size in sizes.most_common(TOP_SITES)]


def host_memory() -> dict[str, Any]:
    """The node's memory, this process's, and the job's cgroup (what Slurm's OOM killer enforces)."""
    memory = psutil.virtual_memory()
    found: dict[str, Any] = {
        "total_mb": memory.total / MB,
        "available_mb": memory.available / MB,
        "used_percent": memory.percent,
        "process_rss_mb": psutil.Process().memory_info().rss / MB,
    }
    cgroup = _cgroup_dir()
    if cgroup is not None:
        limit = _read(cgroup / "memory.max")
        if limit and limit.isdigit():
            found["cgroup_limit_mb"] = int(limit) / MB
        peak = _read(cgroup / "memory.peak")
        if peak and peak.isdigit():
            found["cgroup_peak_mb"] = int(peak) / MB
        events = dict(line.split() for line in (_read(cgroup / "memory.events") or "").splitlines() if " " in line)
        if "oom_kill" in events:
            found["cgroup_oom_kills"] = int(events["oom_kill"])
    return found


def _cgroup_dir() -> Path | None:
    """This process's cgroup v2 folder, where its memory limit and OOM-kill count are."""
    text = _read(Path("/proc/self/cgroup")) or ""
    for line in text.splitlines():
        if line.startswith("0::"):
            path = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            return path if path.is_dir() else None
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, default=str)
