"""Which global ranks record the scheduled torch.profiler windows (`distributed.profiled_ranks`).

`auto`, the default, profiles every rank of a job of up to `EVERY_RANK_UP_TO` ranks (one node of 8 GPUs), so
such jobs get every rank's trace and HTA's cross-rank analyses see the whole job. A larger job gets at most
`MOST_RANKS`, whatever its size: each rank's trace is a file per window, and HTA loads every trace of a window
into one process, its time and memory growing with each rank's trace, so all ranks of a 1,000-rank job would
write 1,000 files a window and exceed the analysis' time and memory limits. The selection shows what differs
between ranks:

- every rank of rank 0's node (at most `EVERY_RANK_UP_TO`): one node's GPUs side by side, which differ by
  their place on the node (NUMA domain, links);
- the last rank: the last node, and the last pipeline stage where the model is split in stages;
- the first rank of other nodes, spread evenly over the job, up to `MOST_RANKS` in all: one view per
  stretch of the job's nodes.

The other ranks still join every exchange: the stage times and straggler figures cover every rank, and a
triggered window records the rank it names, profiled here or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EVERY_RANK_UP_TO = 8
"""`auto` profiles every rank of a job this size or smaller."""
MOST_RANKS = 16
"""`auto` profiles at most this many ranks of a larger job."""


def select_profiled_ranks(setting: Any, world_size: int, hosts: Sequence[str] = ()) -> list[int]:
    """The ranks `setting` ('auto', 'all' or a list of ranks) profiles in a job of `world_size` ranks, ascending.

    `hosts`: each rank's host name, by global rank, which tells the nodes apart; without it (or with fewer
    names than ranks) the job counts as one node.
    """
    if setting == "all" or (setting == "auto" and world_size <= EVERY_RANK_UP_TO):
        return list(range(world_size))
    if setting != "auto":
        return sorted({int(rank) for rank in setting if rank < world_size})
    node_starts = _node_starts(world_size, hosts)
    first_node_end = node_starts[1] if len(node_starts) > 1 else world_size
    chosen = set(range(min(first_node_end, EVERY_RANK_UP_TO))) | {world_size - 1}
    others = node_starts[1:]
    room = MOST_RANKS - len(chosen)  # at least 7: rank 0's node gives at most EVERY_RANK_UP_TO
    if len(others) > room:
        others = [others[round(i * (len(others) - 1) / (room - 1))] for i in range(room)]
    return sorted(chosen | set(others))


def describe_ranks(ranks: Sequence[int], world_size: int) -> str:
    """`0-3, 8, 999 (6 of 1000 ranks)`: consecutive ranks as ranges; `every rank` when none is left out."""
    if list(ranks) == list(range(world_size)):
        return f"every rank ({world_size})"
    parts: list[str] = []
    start = previous = None
    for rank in [*ranks, None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    return f"{', '.join(parts) or 'none'} ({len(ranks)} of {world_size} ranks)"


def _node_starts(world_size: int, hosts: Sequence[str]) -> list[int]:
    """The first global rank of each node, in order of rank (a node is a run of ranks on one host)."""
    if len(hosts) < world_size:
        return [0]
    return [rank for rank in range(world_size) if rank == 0 or hosts[rank] != hosts[rank - 1]]
