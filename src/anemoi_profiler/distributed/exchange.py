"""Exchange a few numbers between ranks at log intervals, on CPU groups with their own short timeout.

The profiler's collectives run on separate gloo groups of CPU tensors: they never touch the training's
NCCL streams (so no device sync), and a rank that died makes the others give up after `timeout_s` with a
warning instead of freezing inside profiler code for the default 30 minutes.

A gloo group connects each member to every other one, so one group over all ranks would hold a socket per
rank of the job on every rank. The exchange is a tree of small groups instead (`exchange_levels`): the ranks
of each node, then the nodes' first ranks in groups of at most `FAN_OUT`, and so on until one group is left.
A gather sends each group's rows up to its first rank and the whole table back down, so every rank still
receives every rank's values, while it holds sockets only to the members of its own groups: the ranks of its
node, plus (on the first rank of a node) a few dozen per level above. Nodes are taken as blocks of
`ranks_per_node` consecutive global ranks, as Lightning and torchrun number them; were they numbered otherwise,
the figures would still be right, only more of the traffic would cross nodes.

Every collective of the profiler's own goes through here, the one broadcast from rank 0 (`broadcast_text`: the run
folder at the start, the ranks a request names) included, never through `trainer.strategy`: the strategy's
`broadcast` runs on the training's default group (NCCL on GPUs: a pickled object copied to the device and back, a
device sync, in the training's communicator), waits the default timeout for a rank that failed, and is each
strategy's own method; these groups exist, with their short timeout, under every strategy and launcher (DDP,
FSDP2 through `ModelParallelStrategy`, torchrun, SLURM) once the default group is up.

The groups are destroyed when the session ends (`close`). Left to the interpreter's exit, a gloo worker
thread can still hold the tensors of the last collective when Python finalizes; freeing them then takes
the GIL, Python ends that thread with `pthread_exit`, and the unwind through a C++ destructor calls
`std::terminate`: "terminate called without an active exception", SIGABRT, a finished job marked failed.
Destroying the groups and dropping the last references to them joins those threads while Python still runs.

That join holds the GIL. A gloo worker thread frees each collective's work after the collective completes; if Python
has let go of the work's tensors by then, the worker must take the GIL to free their Python objects, and a join at
that moment waits for the worker while the worker waits for the GIL: the rank never ends (seen on torch 2.4, where
a group also sits in a reference cycle, freed by whichever garbage collection comes next). So the gathers
reuse buffers that the exchange holds until the groups are gone, and `close` frees the groups themselves.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from anemoi_profiler.logs import get_logger

log = get_logger(__name__)

FAN_OUT = 32
"""The most ranks in one group above the nodes' own: the sockets a node's first rank holds per level."""


def exchange_levels(world_size: int, ranks_per_node: int | None) -> list[list[list[int]]]:
    """The groups of each level, bottom up, as lists of global ranks; each group's first rank joins the level above.

    Level 0 holds each node's ranks (at most `FAN_OUT` a group; `FAN_OUT` when the node size is not known), each
    level above the first ranks of the level below in groups of at most `FAN_OUT`; the top level is one group.
    A group of one rank leads itself and needs no process group; a level of such groups only is left out.
    """
    size = min(ranks_per_node or FAN_OUT, FAN_OUT)
    members = list(range(world_size))
    levels = []
    while True:
        groups = [members[start : start + size] for start in range(0, len(members), size)]
        if any(len(group) > 1 for group in groups):
            levels.append(groups)
        if len(groups) == 1:
            return levels
        members = [group[0] for group in groups]
        size = FAN_OUT


@dataclass
class _Level:
    """This rank's group at one level: its members (global ranks, the first leads), the global ranks below each
    member (`spans`: [start, end) of consecutive ranks) and the process group (None for a group of one)."""

    members: list[int]
    spans: list[tuple[int, int]]
    group: dist.ProcessGroup | None

    @property
    def leader(self) -> int:
        return self.members[0]


@dataclass
class _Buffers:
    """The tensors of one vector length's gathers, held until `close` (see the module's docstring)."""

    table: torch.Tensor
    sent: dict[int, torch.Tensor] = field(default_factory=dict)
    received: dict[int, list[torch.Tensor]] = field(default_factory=dict)


class RankExchange:
    """Gather small float vectors from every rank onto every rank. Inactive (identity) in single-process runs."""

    def __init__(self, timeout_s: float | None = None, ranks_per_node: int | None = None) -> None:
        """With `timeout_s`, join the job's ranks (a collective: every rank must call it); without, stay local.

        `ranks_per_node` (the same on every rank) makes the lowest groups the nodes; None groups `FAN_OUT` ranks.
        """
        self.world_size = 1
        self.rank = 0
        self._levels: list[_Level] | None = None  # None once an exchange failed or the exchange was closed
        self._owned: list[dist.ProcessGroup] = []  # the groups to destroy at `close`, whatever the exchanges did
        self._buffers: dict[int, _Buffers] = {}  # by vector length, kept until `close`
        if timeout_s is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.world_size = dist.get_world_size()
            self.rank = dist.get_rank()
            self._levels = self._join(timedelta(seconds=timeout_s), ranks_per_node)

    def _join(self, timeout: timedelta, ranks_per_node: int | None) -> list[_Level]:
        """Create every group in the same order on every rank (new_group is collective over the job even for
        non-members; local synchronization would name a group by its ranks, and a second session in the same
        processes would then meet the first one's rendezvous keys in the store)."""
        spans = {rank: (rank, rank + 1) for rank in range(self.world_size)}
        mine = []
        for groups in exchange_levels(self.world_size, ranks_per_node):
            for members in groups:
                group = dist.new_group(members, backend="gloo", timeout=timeout) if len(members) > 1 else None
                if group is not None and self.rank in members:
                    self._owned.append(group)
                if self.rank in members:
                    mine.append(_Level(members, [spans[member] for member in members], group))
                spans[members[0]] = (spans[members[0]][0], spans[members[-1]][1])
        return mine

    def gather(self, values: list[float]) -> list[list[float]] | None:
        """Each rank's `values` (same length on every rank), or None once the exchange has failed or closed."""
        if self.world_size == 1:
            return [list(values)]
        if self._levels is None:
            return None
        buffers = self._buffers_for(len(values))
        table = buffers.table
        table[self.rank].copy_(torch.tensor(values, dtype=torch.float64))
        try:
            joined = []
            for index, level in enumerate(self._levels):  # up: each group's rows to its first rank
                joined.append(level)
                self._gather_rows(index, level, buffers)
                if level.leader != self.rank:
                    break
            for level in reversed(joined):  # down: the whole table from each group's first rank
                if level.group is not None:
                    dist.broadcast(table, src=level.leader, group=level.group)
        except Exception as error:  # a rank died or hung: stop exchanging, keep training
            self._stop(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            return None
        return table.tolist()

    def _gather_rows(self, index: int, level: _Level, buffers: _Buffers) -> None:
        """The members' rows into the first member's table (rows padded to the longest span of the group)."""
        if level.group is None:
            return
        table = buffers.table
        longest = max(end - start for start, end in level.spans)
        sent = buffers.sent.setdefault(index, torch.zeros(longest, table.shape[1], dtype=torch.float64))
        start, end = level.spans[level.members.index(self.rank)]
        sent[: end - start].copy_(table[start:end])
        if level.leader != self.rank:
            dist.gather(sent, None, dst=level.leader, group=level.group)
            return
        received = buffers.received.setdefault(index, [torch.empty_like(sent) for _ in level.members])
        dist.gather(sent, received, dst=level.leader, group=level.group)
        for (start, end), rows in zip(level.spans, received, strict=True):
            table[start:end].copy_(rows[: end - start])

    def _buffers_for(self, length: int) -> _Buffers:
        if length not in self._buffers:
            self._buffers[length] = _Buffers(torch.zeros(self.world_size, length, dtype=torch.float64))
        return self._buffers[length]

    def gather_texts(self, text: str) -> list[str]:
        """Each rank's `text` (a host name, say), once at the start; this rank's alone when not exchanging."""
        if self._levels is None:
            return [text]
        texts: list[Any] = [text]
        try:
            joined = []
            for level in self._levels:
                joined.append(level)
                if level.group is None:
                    continue
                parts: list[Any] | None = [None] * len(level.members) if level.leader == self.rank else None
                dist.gather_object(texts, parts, dst=level.leader, group=level.group)
                if level.leader != self.rank:
                    break
                texts = [name for part in parts or [] for name in part]
            for level in reversed(joined):
                if level.group is not None:
                    sent = [texts]
                    dist.broadcast_object_list(sent, src=level.leader, group=level.group)
                    texts = sent[0]
        except Exception as error:  # as in `gather`: stop exchanging, keep training
            self._stop(f"could not exchange {text!r}: {error}")
            return [text]
        return [str(value) for value in texts]

    def broadcast_text(self, text: str) -> str | None:
        """Rank 0's `text` on every rank (a collective; at the start and once per request, never per step); this
        rank's own `text` in a single-process run, None once the exchange has failed or closed."""
        if self.world_size == 1:
            return text
        if self._levels is None:
            return None
        joined = []
        for level in self._levels:  # the levels where this rank receives or sends rank 0's text
            joined.append(level)
            if level.leader != self.rank:
                break
        sent: list[Any] = [text]
        try:
            for level in reversed(joined):
                if level.group is not None:
                    dist.broadcast_object_list(sent, src=level.leader, group=level.group)
        except Exception as error:  # as in `gather`: stop exchanging, keep training
            self._stop(f"could not receive rank 0's text: {error}")
            return None
        return str(sent[0])

    def _stop(self, reason: str) -> None:
        self._levels = None
        log.warning(
            "rank %d stopped exchanging measurements with the other ranks (%s); global figures are no longer logged",
            self.rank,
            reason,
        )

    def close(self) -> None:
        """Destroy the groups after the last exchange; their threads are joined here, not at interpreter exit.

        Local to this rank (gloo's shutdown is no collective), so a rank may close while others still run.
        """
        # Ours are the last references: when `groups` goes too, ProcessGroupGloo's destructor joins its threads.
        groups, self._owned, self._levels = self._owned, [], None
        if not groups:
            return
        while groups:
            group = groups.pop()
            try:
                dist.destroy_process_group(group)
            except Exception as error:  # the user destroyed every group already: nothing left to join
                log.debug("destroying the profiler's process group: %s", error)
            del group
        gc.collect()  # frees the groups (a reference cycle in some torch versions): their threads are joined now
        self._buffers = {}
