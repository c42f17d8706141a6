"""The files of postmortem/ in a run folder: stalls with every rank side by side, out-of-memory errors, signals,
processes killed without a chance to speak (written by the MLflow sender, `tracking.vanished`).

Torch-free: the watchdog merges the ranks' parts of a stall with `merge_stall` while the job hangs, and the
reports read the records back (`reports.postmortem_verdicts` turns them into the diagnosis's first verdicts).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from anemoi_profiler.run_files.layout import POSTMORTEM_DIR, stall_part_path

STALL, OUT_OF_MEMORY, SIGNAL, KILLED = "stall", "out-of-memory", "signal", "killed"
"""Values of the MLflow tag `profiler.postmortem`."""
TAG = "profiler.postmortem"
HEADING = "**anemoi-profiler: post-mortem**"
"""The run's description while the job stalls or is stopped, before its report replaces it."""
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


def stall_told(merged: dict[str, Any]) -> str:
    """What the run's description says of a stall while the job hangs."""
    return merged["summary"] + f" ({POSTMORTEM_DIR}/stall_{merged['episode']}.json)"


def told(what: str) -> str:
    """The run's description while the job hangs: the heading and one line (Markdown)."""
    return f"{HEADING}\n\n{escape_markdown(what)}."


def escape_markdown(text: str) -> str:
    for character in "\\`*_[]<>|#":
        text = text.replace(character, "\\" + character)
    return text


def write_record(path: Path, value: Any) -> None:
    """Whole or not at all: another rank, or the MLflow sender, may read it at any moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(value, indent=1, default=str))
    os.replace(temporary, path)


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


def killed_path(folder: Path, rank: int) -> Path:
    """The record of rank `rank`'s process killed without a chance to speak."""
    return Path(folder) / POSTMORTEM_DIR / f"killed_rank{rank}.json"


def killed_summary(record: dict[str, Any]) -> str:
    """`rank 0 (pid 12 on node1) vanished after step 25: killed by ...; rank 1 (pid 13) ended first (SIGKILL)`."""
    step = "before its first logged step" if record.get("step") is None else f"after step {record['step']}"
    said = f"rank {record['rank']} (pid {record['pid']} on {record['hostname']}) vanished {step}: {record['cause']}"
    for peer in record.get("peers_ended") or []:
        said += f"; {peer_ended(peer)}"
    return said


def peer_ended(peer: dict[str, Any]) -> str:
    """`rank 1 (pid 13) ended first (SIGKILL)`: a rank the vanished process had started (Lightning's launcher)."""
    when = "ended first" if peer.get("first", True) else "was gone with it"
    how = ", ".join(filter(None, [peer["exit"] or "exit status not seen", peer.get("cause")]))
    return f"rank {peer['rank']} (pid {peer['pid']}) {when} ({how})"


def kinds(folder: Path) -> list[str]:
    """The `profiler.postmortem` values a run folder has records for."""
    found = [(STALL, "stall_*.json"), (OUT_OF_MEMORY, "oom_rank*.json"), (SIGNAL, "signal_rank*.json")]
    found.append((KILLED, "killed_rank*.json"))
    return [kind for kind, pattern in found if read_records(folder, pattern)]


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
    said += [record["summary"] for record in read_records(folder, "killed_rank*.json")]
    stalls = read_stalls(folder)
    if stalls:
        said.append(f"{len(stalls)} stall{'s' if len(stalls) > 1 else ''}, the last {stalls[-1]['summary']}")
    return "; ".join(said) or None
