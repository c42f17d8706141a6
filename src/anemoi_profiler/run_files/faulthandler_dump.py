"""faulthandler's dump of a process that holds the interpreter lock, read back as a rank's part of a stall.

The stall watchdog is a Python thread: a training step wedged in C code that keeps the interpreter lock stops it
too. So it also arms faulthandler's C timer (`postmortem.native_stacks`), which writes every thread's Python stack
without the lock, into a file whose first `HEADER_BYTES` are what the watchdog knew at its last sight of progress
(rank, episode, step, the training thread's id). Torch-free: the MLflow sender, a process of its own, reads the
dump while the job is still wedged (`record_wedged`), and the watchdog reads the same dump once it runs again, so
the two write the same part of the same episode.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from anemoi_profiler.run_files.layout import stall_part_path, stall_path
from anemoi_profiler.run_files.postmortem_files import merge_stall, read_parts, write_record
from anemoi_profiler.run_files.stack_frames import Frame, describe, phase_of, user_frame

HEADER_BYTES = 2048
"""The header is rewritten in place (`os.pwrite`) at each re-arm; faulthandler writes after it."""
SETTLED_S = 0.3
"""A dump untouched this long is whole (faulthandler writes it in well under a millisecond)."""
SEEN_BY = "faulthandler: no Python thread of the process could run (the interpreter lock held)"
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def header_bytes(values: dict[str, Any]) -> bytes:
    """The header as written: one JSON line padded to `HEADER_BYTES`."""
    text = json.dumps(values, separators=(",", ":"), default=str)
    if len(text) >= HEADER_BYTES:
        raise ValueError(f"faulthandler header over {HEADER_BYTES} bytes")
    return text.ljust(HEADER_BYTES - 1).encode() + b"\n"


def parse_threads(text: str) -> list[dict[str, Any]]:
    """faulthandler's text (innermost frame first) as threads with stacks outermost first, as `thread_stacks`."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        if found := _THREAD.match(line):
            threads.append({"ident": int(found[1], 16), "stack": []})
        elif threads and (frame := _FRAME.match(line)):
            threads[-1]["stack"].insert(0, {"file": frame[1], "line": int(frame[2]), "function": frame[3], "code": ""})
    return threads


def read_dump(path: Path, settled_s: float = SETTLED_S) -> tuple[dict[str, Any], list[dict[str, Any]], float] | None:
    """The header, threads and write time of a dump that was written; None while none was, or while it may be
    being written."""
    try:
        written = path.stat().st_mtime
        if path.stat().st_size <= HEADER_BYTES or time.time() - written < settled_s:
            return None
        data = path.read_bytes()
        header = json.loads(data[:HEADER_BYTES])
    except (OSError, ValueError):
        return None
    threads = parse_threads(data[HEADER_BYTES:].decode(errors="replace"))
    return (header, threads, written) if threads else None


def wedged_part(header: dict[str, Any], threads: list[dict[str, Any]], written: float) -> dict[str, Any]:
    """The rank's part of the stall, as the watchdog writes one (`postmortem/stall_<k>/rank<r>.json`)."""
    training = next((thread for thread in threads if thread["ident"] == header["training_thread"]), None)
    frames: list[Frame] = training["stack"] if training is not None else []
    for thread in threads:
        thread["name"] = header["training_thread_name"] if thread is training else f"thread {thread['ident']:#x}"
        thread["daemon"] = None
    return {
        "rank": header["rank"],
        "hostname": header["hostname"],
        "pid": header["pid"],
        "episode": header["episode"],
        "detected_at": written,
        "threshold_s": header["threshold_s"],
        "stalled_for_s": written - header["progress_at"],
        "last_step": header["last_step"],
        "batches_finished": header["batches_finished"],
        "phase": phase_of(frames),
        "frame": describe(user_frame(frames)),
        "innermost": describe(frames[-1] if frames else None),
        "training_thread": header["training_thread_name"] if training is not None else None,
        "resumed_after_s": None,
        "seen_by": SEEN_BY,
        "last_collectives": None,
        "threads": threads,
    }


def record_wedged(run_dir: Path, dump: Path) -> dict[str, Any] | None:
    """From another process (the MLflow sender): a written dump becomes the rank's part and the merged stall.
    The merged stall when a part was written now; None when there is no dump, or its part exists already
    (written earlier, or by the watchdog once it could run again)."""
    found = read_dump(dump)
    if found is None:
        return None
    header, threads, written = found
    episode, rank = header["episode"], header["rank"]
    part_path = stall_part_path(run_dir, episode, rank)
    if part_path.exists():
        return None
    write_record(part_path, wedged_part(header, threads, written))
    merged = merge_stall(read_parts(run_dir, episode), header["world_size"])
    write_record(stall_path(run_dir, episode), merged)
    return merged
