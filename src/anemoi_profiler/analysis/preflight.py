"""Find trace folders and check their files before HTA sees them.

HTA keys each file by `distributedInfo.rank`, reads a file without it as rank 0, lets a later file with
the same rank silently replace an earlier one, and fails deep inside pandas on a truncated file or a
CPU-only trace. Reading every file once here turns those cases into a clear error or a warning that
names the file, and tells the runner which analyses the traces can support.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anemoi_profiler.run_files.layout import CONFIG_FILE, ENVIRONMENT_FILE, HTA_DIR, TRACES_DIR

TRACE_SUFFIXES = (".json", ".json.gz")

GPU_KERNEL_CATEGORIES = frozenset({"kernel", "Kernel"})
MEMORY_COPY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
CUDA_SYNC_CATEGORY = "cuda_sync"
MAX_NCCL_NAMES_KEPT = 20
_PROFILER_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_HEAD_RANK = re.compile(r'"distributedInfo"\s*:\s*\{[^}]*?"rank"\s*:\s*(\d+)')
_HEAD_CHARS = 1 << 16
_NUMBER = re.compile(r"(\d+)")


class TraceError(Exception):
    """A trace file that cannot be analysed (truncated, corrupt, not a Chrome trace); names the file."""


class NoTracesError(FileNotFoundError):
    """The target holds no trace files."""


@dataclass(frozen=True)
class TraceFileInfo:
    """What one trace file holds, as far as choosing HTA analyses is concerned."""

    path: Path
    rank: int | None
    world_size: int | None
    gpu_kernels: int
    nccl_kernels: int
    cuda_sync_events: int
    memory_copies: int
    profiler_steps: int
    nccl_kernel_names: tuple[str, ...] = ()


@dataclass
class WindowCheck:
    """The files of one trace folder and what they allow. With several files for one rank, the first by
    name is analysed and the others are reported."""

    folder: Path
    files: list[TraceFileInfo]
    by_rank: dict[int, list[TraceFileInfo]] = field(init=False)

    def __post_init__(self) -> None:
        by_rank: dict[int, list[TraceFileInfo]] = {}
        for info in sorted(self.files, key=lambda f: f.path.name):
            by_rank.setdefault(0 if info.rank is None else info.rank, []).append(info)
        self.by_rank = dict(sorted(by_rank.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self.by_rank)

    @property
    def trace_files(self) -> dict[int, Path]:
        return {rank: infos[0].path for rank, infos in self.by_rank.items()}

    @property
    def duplicate_ranks(self) -> dict[int, list[Path]]:
        return {rank: [i.path for i in infos] for rank, infos in self.by_rank.items() if len(infos) > 1}

    @property
    def missing_ranks(self) -> list[int]:
        return [rank for rank in range(max(self.ranks, default=-1)) if rank not in self.by_rank]

    @property
    def analysed_files(self) -> list[TraceFileInfo]:
        return [infos[0] for infos in self.by_rank.values()]

    @property
    def world_size(self) -> int | None:
        return max((info.world_size for info in self.analysed_files if info.world_size), default=None)

    @property
    def gpu_kernels(self) -> int:
        return sum(info.gpu_kernels for info in self.analysed_files)

    @property
    def nccl_kernels(self) -> int:
        return sum(info.nccl_kernels for info in self.analysed_files)

    @property
    def cuda_sync_events(self) -> int:
        return sum(info.cuda_sync_events for info in self.analysed_files)

    @property
    def memory_copies(self) -> int:
        return sum(info.memory_copies for info in self.analysed_files)

    @property
    def profiler_steps(self) -> int:
        return min((info.profiler_steps for info in self.analysed_files), default=0)

    @property
    def nccl_kernel_names(self) -> list[str]:
        names = {name for info in self.analysed_files for name in info.nccl_kernel_names}
        return sorted(names)[:MAX_NCCL_NAMES_KEPT]

    @property
    def warnings(self) -> list[str]:
        notes = []
        for rank, infos in self.by_rank.items():
            if len(infos) < 2:
                continue
            unranked = [i.path.name for i in infos if i.rank is None]
            why = f" ({', '.join(unranked)} without distributedInfo.rank: read as rank 0)" if unranked else ""
            notes.append(
                f"rank {rank} appears in {len(infos)} files: {', '.join(i.path.name for i in infos)}{why}; "
                f"analysed {infos[0].path.name} only"
            )
        if self.missing_ranks:
            notes.append(f"ranks missing from the folder: {format_ranks(self.missing_ranks)}")
        return notes

    def as_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "world_size": self.world_size,
            "files": {str(rank): path.name for rank, path in self.trace_files.items()},
            "missing_ranks": self.missing_ranks,
            "duplicate_ranks": {str(r): [p.name for p in paths] for r, paths in self.duplicate_ranks.items()},
            "gpu_kernels": self.gpu_kernels,
            "nccl_kernels": self.nccl_kernels,
            "cuda_sync_events": self.cuda_sync_events,
            "memory_copies": self.memory_copies,
            "profiler_steps": self.profiler_steps,
        }


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def trace_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if is_trace_file(p))


def traces_root(target: Path) -> Path:
    """The folder that window names are relative to: `<run>/traces` for a run folder (whose own JSON
    files, such as report.json, are no traces), else the target."""
    run_traces = target / TRACES_DIR
    is_run_folder = (target / CONFIG_FILE).is_file() and (target / ENVIRONMENT_FILE).is_file()
    return run_traces if run_traces.is_dir() or is_run_folder else target


def find_window_dirs(target: Path) -> list[Path]:
    """Folders to analyse, in natural order (window_2 before window_10): for a run folder, every folder
    below `<run>/traces` that holds trace files; for a folder with trace files directly in it, that
    folder; otherwise (a downloaded `traces` folder) every folder below it that holds trace files.
    Folders named `hta` hold our results and are skipped.

    Args:
        target: A run folder, a trace folder, or a folder of trace folders.

    Returns:
        The folders; empty for a run folder whose run had no profiling windows.

    Raises:
        NoTracesError: `target` is not a folder.
    """
    target = Path(target)
    if not target.is_dir():
        raise NoTracesError(f"no such folder: {target}")
    root = traces_root(target)
    if not root.is_dir():
        return []  # a run folder whose run had no profiling windows
    if root == target and trace_files_in(target):
        return [target]
    folders = {
        path.parent
        for path in root.rglob("*")
        if is_trace_file(path) and HTA_DIR not in path.relative_to(root).parts[:-1]
    }
    return sorted(folders, key=lambda folder: _natural_key(folder.relative_to(root)))


def window_name(folder: Path, target: Path) -> str:
    """`train/window_0` for a window of a run folder; empty for a plain trace folder."""
    relative = Path(folder).relative_to(traces_root(Path(target)))
    return "" if relative == Path() else relative.as_posix()


def check_window(folder: Path, ranks: Collection[int] | None = None) -> WindowCheck:
    """Read every trace file of a folder (of `ranks` only, when given); raise TraceError naming the first
    unreadable one. A rank's file is picked by the rank in its head, so the others are never read whole.

    Args:
        folder: A folder of trace files, one per rank.
        ranks: The ranks to read; None: every file.

    Returns:
        The files read and what they hold (kernels, collectives, steps), for `plan_analyses`.

    Raises:
        NoTracesError: No such folder, no trace files in it, or none of `ranks`.
        TraceError: A file is corrupt or not a Chrome trace; the message names it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise NoTracesError(f"no such folder: {folder}")
    paths = trace_files_in(folder)
    if not paths:
        raise NoTracesError(f"no trace files ({', '.join('*' + s for s in TRACE_SUFFIXES)}) in {folder}")
    if ranks is not None:
        paths = [path for path in paths if rank_in_head(path) in (*ranks, None)]
    files = [read_trace_info(path) for path in paths]
    if ranks is not None:
        files = [info for info in files if (info.rank or 0) in ranks]
        if not files:
            raise NoTracesError(f"no trace of ranks {format_ranks(ranks)} in {folder}")
    return WindowCheck(folder=folder, files=files)


def rank_in_head(path: Path) -> int | None:
    """`distributedInfo.rank` when the trace names it before its events (torch writes its metadata first)."""
    try:
        with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as stream:
            head = stream.read(_HEAD_CHARS)
    except (OSError, EOFError, zlib.error, ValueError, UnicodeDecodeError):
        return None  # the full read names the problem
    events = head.find('"traceEvents"')
    match = _HEAD_RANK.search(head if events < 0 else head[:events])
    return int(match.group(1)) if match else None


def parse_ranks(text: str) -> list[int]:
    """`0-7,12` -> [0, ..., 7, 12]; ValueError naming the part that is no rank or range."""
    ranks: set[int] = set()
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or (last and int(last) < int(first)):
            raise ValueError(f"{part!r} is no rank or range of ranks (like 0-7)")
        ranks.update(range(int(first), int(last or first) + 1))
    if not ranks:
        raise ValueError(f"{text!r} names no rank")
    return sorted(ranks)


def read_trace_info(path: Path) -> TraceFileInfo:
    trace = _load_trace(path)
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a PyTorch profiler trace (no traceEvents list)")
    distributed = trace.get("distributedInfo")
    distributed = distributed if isinstance(distributed, dict) else {}
    rank = distributed.get("rank")
    if rank is not None and (not isinstance(rank, int) or rank < 0):
        raise TraceError(f"{path}: distributedInfo.rank is {rank!r}, expected a rank number")
    return _count_events(path, events, rank, distributed.get("world_size"))


def format_ranks(ranks: Iterable[int]) -> str:
    """`0-33, 35` rather than 35 numbers: a 1000-rank job must stay readable."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _load_trace(path: Path) -> dict[str, Any]:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as stream:
                trace = json.load(stream)
        else:
            with path.open("rb") as stream:
                trace = json.load(stream)
    except (OSError, EOFError, zlib.error, ValueError) as error:
        reason = f"{type(error).__name__}: {error}"
        raise TraceError(f"{path}: truncated or corrupt trace file ({reason})") from error
    if not isinstance(trace, dict):
        raise TraceError(f"{path}: not a PyTorch profiler trace (top level is not a JSON object)")
    return trace


def _count_events(path: Path, events: list[Any], rank: int | None, world_size: Any) -> TraceFileInfo:
    gpu_kernels = nccl_kernels = cuda_sync = memory_copies = 0
    nccl_names: set[str] = set()
    steps: set[str] = set()
    for event in events:
        if not isinstance(event, dict):
            continue
        category, name = event.get("cat"), str(event.get("name", ""))
        if category in GPU_KERNEL_CATEGORIES:
            gpu_kernels += 1
            if "nccl" in name.lower():
                nccl_kernels += 1
                if len(nccl_names) < MAX_NCCL_NAMES_KEPT:
                    nccl_names.add(name)
        elif category in MEMORY_COPY_CATEGORIES:
            memory_copies += 1
        elif category == CUDA_SYNC_CATEGORY:
            cuda_sync += 1
        elif (step := _PROFILER_STEP.match(name)) is not None:
            steps.add(step.group(1))
    return TraceFileInfo(
        path=path,
        rank=rank,
        world_size=world_size if isinstance(world_size, int) else None,
        gpu_kernels=gpu_kernels,
        nccl_kernels=nccl_kernels,
        cuda_sync_events=cuda_sync,
        memory_copies=memory_copies,
        profiler_steps=len(steps),
        nccl_kernel_names=tuple(sorted(nccl_names)),
    )


def _natural_key(relative: Path) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in _NUMBER.split(relative.as_posix())]


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")


def trace_rank(path: Path) -> int | None:
    """The rank a trace names in `distributedInfo` (read from its head), else the rank in its file name."""
    rank = rank_in_head(path)
    if rank is None and (match := _RANK_IN_NAME.search(path.name)):
        rank = int(match.group(1))
    return rank
