"""`profiler.traces: flagged`: which ranks keep a window's trace, decided from the exchanged window summaries.

Rank 0 always keeps its traces (one reference rank to open); another rank keeps a window's trace when it is
the rank of the maximum of a flag field (the rank others wait for, or the one that waits most), or more than
`profiler.flag_distance_pct` points from the ranks' median there. The others keep only their summary row.
Every rank decides from the same gathered table, so no further exchange is needed; a window the exchange did
not cover keeps every trace, and a window triggered or requested for some ranks keeps theirs
(`cluster.window_exchange`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from anemoi_profiler.profiling.window_summarizer import WindowKey
from anemoi_profiler.profiling.window_table import WindowTable
from anemoi_profiler.run_files.layout import HELD_SUFFIX, TRACE_SUFFIX, TRACES_DIR

FLAG_FIELDS = ("idle_pct", "exposed_communication_pct", "host_collective_pct")
"""Device idle, communication nothing hides, and host collectives (gloo's wait on CPU-only ranks)."""
ALWAYS_KEPT = (0,)


def flagged_ranks(table: WindowTable, distance_pct: float) -> set[int]:
    """Ranks of `table` that stand out in a flag field, plus rank 0."""
    ranks = set(ALWAYS_KEPT)
    for field in FLAG_FIELDS:
        spread = table.spread(field)
        if spread.argmax_rank < 0:
            continue  # nobody assessed it (device fields of CPU-only ranks)
        ranks.add(spread.argmax_rank)
        for rank, value in zip(table.ranks, table.column(field), strict=True):
            if not math.isnan(value) and abs(value - spread.median) > distance_pct:
                ranks.add(rank)
    return ranks


def keeps_trace(table: WindowTable, rank: int, distance_pct: float) -> bool:
    """Whether `rank` keeps its trace of the window `table` describes (a rank outside the table keeps its own)."""
    return rank not in table.ranks or rank in flagged_ranks(table, distance_pct)


def settle_held_traces(run_dir: Path, rank: int, keep: Mapping[WindowKey, bool], final: bool) -> None:
    """Rename this rank's held traces to their final names where `keep` says so, delete those it says not to.

    A trace whose window has no decision yet stays held (its exchange comes later), or at the `final` call is
    kept: the exchange did not cover it. A held trace is written by the compressor thread, maybe after its
    window's decision: the next call, at the latest the final one after the writer's flush, settles it.
    """
    for held in sorted((run_dir / TRACES_DIR).glob(f"*/window_*/rank{rank}{TRACE_SUFFIX}{HELD_SUFFIX}")):
        decision = keep.get((held.parent.parent.name, int(held.parent.name.removeprefix("window_"))))
        if decision is None and not final:
            continue
        if decision is False:
            held.unlink()
        else:
            held.replace(held.with_name(held.name.removesuffix(HELD_SUFFIX)))
