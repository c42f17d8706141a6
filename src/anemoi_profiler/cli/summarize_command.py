"""`anemoi-profiler summarize <trace folder | run folder> [--json]`: the window summary from saved Chrome traces.

The same figures the profiler computes in process at a window's close (docs/hta.md), read from trace files one
event at a time: bounded memory, no HTA needed, for old runs and to check the figures against HTA's.
Input problems end with one line naming the cause and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from anemoi_profiler.analysis.preflight import NoTracesError, find_window_dirs, trace_files_in, trace_rank, window_name
from anemoi_profiler.profiling.trace_stream import TraceReadError, read_window_events
from anemoi_profiler.profiling.window_summary import WindowSummary, summarize
from anemoi_profiler.profiling.window_table import WindowTable

NAME = "summarize"
HELP = "summarise profiled windows from saved traces: idle, overlap, top kernels per rank (no HTA needed)"
DESCRIPTION = (
    "Compute the window summary (device idle and its causes, compute/communication overlap, launch delay, "
    "top kernels) of every rank from Chrome traces: a trace folder, or every traces/<stage>/window_<k>/ "
    "of a run folder. Reads each trace event by event, in bounded memory."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="trace folder or run folder")
    parser.add_argument("--json", action="store_true", help="print JSON (every field, rank and top kernel)")


def run(args: argparse.Namespace) -> int:
    target = Path(args.target)
    try:
        tables = summarize_target(target)
    except (NoTracesError, TraceReadError, OSError) as error:
        print(f"anemoi-profiler summarize: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({name or str(target): table.to_json() for name, table in tables.items()}, indent=1))
        return 0
    for name, table in tables.items():
        print(f"== {name or target} ({len(table.ranks)} rank{'s' if len(table.ranks) != 1 else ''})")
        print(table.format_text())
        print()
    return 0


def summarize_target(target: Path) -> dict[str, WindowTable]:
    """Each window folder below `target` (by its name, '' for a plain trace folder) -> its ranks' table."""
    folders = find_window_dirs(target)
    if not folders:
        raise NoTracesError(f"no trace files in {target}")
    return {window_name(folder, target): summarize_folder(folder) for folder in folders}


def summarize_folder(folder: Path) -> WindowTable:
    """The folder's traces, rank by rank; a JSON file that is no trace (HTA's output, notes) is skipped with a line."""
    summaries: dict[int, WindowSummary] = {}
    for index, path in enumerate(trace_files_in(folder)):
        try:
            summary = summarize(read_window_events(path))
        except TraceReadError as error:
            print(f"anemoi-profiler summarize: skipping {path}: {' '.join(str(error).split())}", file=sys.stderr)
            continue
        rank = trace_rank(path)
        summaries[index if rank is None or rank in summaries else rank] = summary
    if not summaries:
        raise NoTracesError(f"no readable trace in {folder}")
    return WindowTable.of(summaries)
