"""What postmortem/ in a run folder says: stalls with every rank side by side, out-of-memory errors, signals.

Torch-free: the watchdog merges the ranks' parts of a stall with `merge_stall` while the job hangs, and the
report (also `anemoi-profiler report` on the folder of a killed job) reads the files back through the three
checks here, which the diagnosis runs first so that the report and the run's description lead with them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..layout import POSTMORTEM_DIR, stall_part_path
from .outcome import Verdict
from .run_data import RunData

STALL, OUT_OF_MEMORY, SIGNAL = "stall", "out-of-memory", "signal"
"""Values of the MLflow tag `profiler.postmortem`."""
TAG = "profiler.postmortem"
GRADIENT_ALL_REDUCE = "gradient all-reduce"
"""The phase of a rank in DDP's backward whose last gradient bucket's all-reduce has not completed."""


def is_waiting(phase: str) -> bool:
    """A rank in a collective (or DDP's gradient all-reduce) waits for the others."""
    return phase.startswith("collective") or GRADIENT_ALL_REDUCE in phase


def merge_stall(parts: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Every rank's part of one stall side by side, and who holds the others.

    The ranks that wait in a collective are held by those that do not; where no rank waits, the ranks whose
    phase differs from the most common one stand out; a rank with no part is dead or not stalled.
    """
    parts = sorted(parts, key=lambda part: part["rank"])
    present = {part["rank"] for part in parts}
    missing = [rank for rank in range(world_size) if rank not in present]
    waiting = [part["rank"] for part in parts if is_waiting(part["phase"])]
    if waiting and len(waiting) < len(parts):
        holding = [part["rank"] for part in parts if part["rank"] not in waiting]
    elif len(parts) > 1:
        common, _ = Counter(part["phase"] for part in parts).most_common(1)[0]
        holding = [part["rank"] for part in parts if part["phase"] != common]
    else:
        holding = []
    if waiting and len(waiting) == len(parts):
        holding = missing  # all present ranks wait: for the ones that wrote nothing
    steps = [part["last_step"] for part in parts]
    ranks = [{key: value for key, value in part.items() if key != "threads"} for part in parts]
    merged = {
        "episode": parts[0]["episode"] if parts else None,
        "parts": f"{POSTMORTEM_DIR}/stall_<k>/rank<r>.json",
        "world_size": world_size,
        "last_step": min(steps) if steps else None,
        "ranks": ranks,
        "missing_ranks": missing,
        "holding_ranks": holding,
        "waiting_ranks": waiting,
        "stalled_for_s": max((part["stalled_for_s"] for part in parts), default=None),
        "resumed_after_s": _resumed(parts),
        "behind_in_collectives": _behind(parts),
    }
    merged["summary"] = stall_summary(merged)
    return merged


def _behind(parts: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per process group, the ranks whose last collective (Flight Recorder's sequence number) is behind the
    others': the ones the others wait for in it."""
    seqs: dict[str, dict[int, int]] = {}
    for part in parts:
        for group, last in (part.get("last_collectives") or {}).items():
            if isinstance(last.get("seq"), int):
                seqs.setdefault(group, {})[part["rank"]] = last["seq"]
    behind = {}
    for group, by_rank in seqs.items():
        ahead = max(by_rank.values())
        if late := [rank for rank, seq in sorted(by_rank.items()) if seq < ahead]:
            behind[group] = late
    return behind


def _resumed(parts: list[dict[str, Any]]) -> float | None:
    resumed = [part.get("resumed_after_s") for part in parts]
    return max(resumed) if resumed and all(value is not None for value in resumed) else None  # type: ignore[type-var]


def stall_summary(merged: dict[str, Any]) -> str:
    """`stalled after step 12: rank 1 in forward (training_step) at training_step (train.py:42); rank 0 waiting
    in gradient all-reduce`."""
    by_rank = {part["rank"]: part for part in merged["ranks"]}
    said: list[str] = []
    for rank in merged["holding_ranks"]:
        part = by_rank.get(rank)
        if part is None:
            said.append(f"rank {rank} wrote no part (dead, or not stalled)")
        else:
            said.append(f"rank {rank} in {part['phase']} at {part['frame']}")
    if merged["waiting_ranks"]:
        phases = sorted({by_rank[rank]["phase"] for rank in merged["waiting_ranks"]})
        ranks = ",".join(map(str, merged["waiting_ranks"]))
        said.append(f"rank{'s' if len(merged['waiting_ranks']) > 1 else ''} {ranks} waiting in {' / '.join(phases)}")
    if not merged["holding_ranks"] and not merged["waiting_ranks"]:
        said += [f"rank {part['rank']} in {part['phase']} at {part['frame']}" for part in merged["ranks"]]
    return f"stalled after step {merged['last_step']}: " + "; ".join(said)


# ---- reading a run folder ----
def read_parts(folder: Path, episode: int) -> list[dict[str, Any]]:
    """The ranks' parts of stall `episode` (a part being written, or cut by a kill, is left out)."""
    parts = []
    for path in sorted(stall_part_path(Path(folder), episode, 0).parent.glob("rank*.json")):
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return parts


def read_stalls(folder: Path) -> list[dict[str, Any]]:
    """Every stall of the run, merged again from the parts: a rank may have added its part's end after the
    last merge."""
    stalls = []
    for record in read_records(folder, "stall_*.json"):
        parts = read_parts(folder, record["episode"])
        merged = merge_stall(parts, record["world_size"]) if parts else record
        stalls.append({**merged, "file": record["file"]})
    return stalls


def read_records(folder: Path, pattern: str) -> list[dict[str, Any]]:
    records = []
    for path in sorted((Path(folder) / POSTMORTEM_DIR).glob(pattern)):
        try:
            records.append({**json.loads(path.read_text()), "file": f"{POSTMORTEM_DIR}/{path.name}"})
        except (OSError, ValueError):
            continue  # a part being written, or cut by a kill: the others still count
    return records


def kinds(folder: Path) -> list[str]:
    """The `profiler.postmortem` values a run folder has records for."""
    found = [(STALL, "stall_*.json"), (OUT_OF_MEMORY, "oom_rank*.json"), (SIGNAL, "signal_rank*.json")]
    return [kind for kind, pattern in found if read_records(folder, pattern)]


def postmortems(run: RunData) -> dict[str, Verdict]:
    """The post-mortems of the run folder as verdicts: none for a run that nothing stopped or held."""
    found: dict[str, Verdict] = {}
    for name, check in (("out of memory", out_of_memory), ("signal", signals), ("stall", stalls)):
        try:
            verdict = check(run)
        except (KeyError, TypeError, ValueError) as error:  # a record of another version: said, never raised
            verdict = Verdict(name, name, "info", "unreadable record", f"{type(error).__name__}: {error}.", "-")
        if verdict is not None:
            found[name] = verdict
    return found


def stopped(record: dict[str, Any]) -> str:
    return f"stopped by signal at step {record['step']} ({record['signal']})"


def headline(folder: Path) -> str | None:
    """One line for the report's header: what stopped or held the run, from every rank's records."""
    said = []
    for record in read_records(folder, "oom_rank*.json"):
        said.append(f"out of memory at step {record['step']} on rank {record['rank']} ({record['kind']})")
    signalled = read_records(folder, "signal_rank*.json")
    if signalled:
        said.append(stopped(min(signalled, key=lambda record: record["rank"])))
    stalls = read_stalls(folder)
    if stalls:
        said.append(f"{len(stalls)} stall{'s' if len(stalls) > 1 else ''}, the last {stalls[-1]['summary']}")
    return "; ".join(said) or None


def out_of_memory(run: RunData) -> Verdict | None:
    records = read_records(run.folder, "oom_rank*.json")
    if not records:
        return None
    first = min(records, key=lambda record: (record.get("step") or 0, record["rank"]))
    ranks = ",".join(str(record["rank"]) for record in records)
    if first.get("kind") == "host":
        value = f"DataLoader worker killed ({first['error']}) at step {first['step']} on rank {ranks}"
        message = "The kernel killed a DataLoader worker, which is what its OOM killer does when host memory runs out"
        message += f"; {_host_figures(first)}" if first.get("host") else ""
        next_step = "Fewer num_workers or prefetch_factor, smaller samples in memory, or more host memory per task"
    else:
        value = f"at step {first['step']} on rank {ranks}, in {first['phase']} at {first['frame']}"
        message = f"{first['error']}; {_device_figures(first)}"
        next_step = (
            f"Open {first['file']} (and the snapshot beside it at pytorch.org/memory_viz where there is one); "
            "a smaller batch, activation checkpointing or a sharded strategy lower the peak"
        )
    return Verdict(OUT_OF_MEMORY, "out of memory", "high", value, message + ".", next_step)


def _device_figures(record: dict[str, Any]) -> str:
    device = record.get("device") or {}
    if "not_assessed" in device:
        return f"device memory not assessed ({device['not_assessed']})"
    said = [
        f"peak allocated {device['peak_allocated_mb']:.0f} MB and reserved {device['peak_reserved_mb']:.0f} MB "
        f"of {device['capacity_mb']:.0f} MB",
        f"fragmentation {device['fragmentation'] * 100:.0f} % of reserved",
    ]
    sites = record.get("top_allocation_sites") or []
    if sites:
        said.append(f"largest allocation site {sites[0]['site']} ({sites[0]['mb']:.0f} MB)")
    if record.get("snapshot_not_taken"):
        said.append(f"no snapshot: {record['snapshot_not_taken']}")
    return ", ".join(said)


def _host_figures(record: dict[str, Any]) -> str:
    host = record["host"]
    said = [f"host memory {host['used_percent']:.0f} % used of {host['total_mb']:.0f} MB"]
    if host.get("cgroup_limit_mb"):
        said.append(f"job limit (cgroup) {host['cgroup_limit_mb']:.0f} MB, peak {host.get('cgroup_peak_mb', 0):.0f} MB")
    if host.get("cgroup_oom_kills"):
        said.append(f"{host['cgroup_oom_kills']} OOM kills in the job's cgroup")
    return ", ".join(said)


def stalls(run: RunData) -> Verdict | None:
    records = read_stalls(run.folder)
    if not records:
        return None
    longest = max(records, key=lambda record: record.get("stalled_for_s") or 0.0)
    resumed = [record for record in records if record.get("resumed_after_s") is not None]
    value = f"{len(records)} stall{'s' if len(records) > 1 else ''}; {longest['summary']}"
    if len(resumed) == len(records):
        length = max(record["resumed_after_s"] for record in records)
        message = f"Every stall ended: the run moved on after at most {length:.0f} s without a finished batch"
    else:
        message = "The run did not move on from the last stall before it ended"
    next_step = (
        f"Read {longest['file']} (each rank's phase and frame) and postmortem/stall_<k>/rank<r>.json (every "
        "thread's stack); with NCCL, the Flight Recorder dumps beside them"
    )
    return Verdict(STALL, "stall", "high", value, message + ".", next_step)  # high: the post-mortems lead


def signals(run: RunData) -> Verdict | None:
    records = read_records(run.folder, "signal_rank*.json")
    if not records:
        return None
    first = min(records, key=lambda record: record["rank"])
    ranks = ",".join(str(record["rank"]) for record in records)
    value = f"{first['signal']} at step {first['step']} on rank {ranks}, in {first['phase']} at {first['frame']}"
    if run.header.get("status", "KILLED") == "KILLED":
        message = f"The run was {stopped(first)}: what was measured until then is in the report"
    else:
        message = f"{first['signal']} arrived and the run went on (the handler that was there decided)"
    next_step = "A scheduler's time limit sends SIGTERM: resume from the last checkpoint, or ask for more time"
    return Verdict("stopped-by-signal", "stopped by signal", "high", value, message + ".", next_step)
