"""Exchange a few numbers between ranks at log intervals, on a CPU group with its own short timeout.

The profiler's collectives run on a separate gloo group of CPU tensors: they never touch the training's
NCCL streams (so no device sync), and a rank that died makes the others give up after `timeout_s` with a
warning instead of freezing inside profiler code for the default 30 minutes.

The group is destroyed when the session ends (`close`). Left to the interpreter's exit, a gloo worker
thread can still hold the tensors of the last all-gather when Python finalizes; freeing them then takes
the GIL, Python ends that thread with `pthread_exit`, and the unwind through a C++ destructor calls
`std::terminate`: "terminate called without an active exception", SIGABRT, a finished job marked failed.
Destroying the group and dropping the last reference to it joins those threads while Python still runs.

That join holds the GIL. A gloo worker thread frees each collective's work after the collective completes; if Python
has let go of the work's tensors by then, the worker must take the GIL to free their Python objects, and a join at
that moment waits for the worker while the worker waits for the GIL: the rank never ends (seen on torch 2.4, where
the group also sits in a reference cycle, freed by whichever garbage collection comes next). So the all-gathers
reuse buffers that the exchange holds until the group is gone, and `close` frees the group itself.
"""

from __future__ import annotations

import gc
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..logs import get_logger

log = get_logger(__name__)


class RankExchange:
    """All-gather small float vectors from every rank. Inactive (identity) in single-process runs."""

    def __init__(self, timeout_s: float | None = None) -> None:
        """With `timeout_s`, join the job's ranks (a collective: every rank must call it); without, stay local."""
        self.world_size = 1
        self.rank = 0
        self._group: dist.ProcessGroup | None = None  # None once an exchange failed or the exchange was closed
        self._owned: dist.ProcessGroup | None = None  # the group to destroy at `close`, whatever the exchanges did
        self._buffers: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}  # by length, kept until `close`
        if timeout_s is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.world_size = dist.get_world_size()
            self.rank = dist.get_rank()
            # Every rank creates the group at setup, in the same order: new_group is itself collective.
            self._group = self._owned = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def gather(self, values: list[float]) -> list[list[float]] | None:
        """Each rank's `values` (same length on every rank), or None once the exchange has failed or closed."""
        if self.world_size == 1:
            return [list(values)]
        if self._group is None:
            return None
        local, gathered = self._buffers_for(len(values))
        local.copy_(torch.tensor(values, dtype=torch.float64))
        try:
            dist.all_gather(gathered, local, group=self._group)
        except Exception as error:  # a rank died or hung: stop exchanging, keep training
            self._group = None
            log.warning(
                "rank %d stopped exchanging measurements with the other ranks (%s: %s); "
                "global figures are no longer logged",
                self.rank,
                type(error).__name__,
                str(error).splitlines()[0] if str(error) else "",
            )
            return None
        return [tensor.tolist() for tensor in gathered]

    def _buffers_for(self, length: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if length not in self._buffers:
            local = torch.zeros(length, dtype=torch.float64)
            self._buffers[length] = (local, [torch.empty_like(local) for _ in range(self.world_size)])
        return self._buffers[length]

    def gather_texts(self, text: str) -> list[str]:
        """Each rank's `text` (a host name, say), once at the start; this rank's alone when not exchanging."""
        if self._group is None:
            return [text]
        texts: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(texts, text, group=self._group)
        except Exception as error:  # as in `gather`: stop exchanging, keep training
            self._group = None
            log.warning("rank %d could not exchange %r with the others: %s", self.rank, text, error)
            return [text]
        return [str(value) for value in texts]

    def broadcast_text(self, text: str) -> str | None:
        """Rank 0's `text` on every rank (a collective; once per request, never per step), or None once the
        exchange has failed or closed."""
        if self.world_size == 1:
            return text
        if self._group is None:
            return None
        sent: list[Any] = [text]
        try:
            dist.broadcast_object_list(sent, src=0, group=self._group)
        except Exception as error:  # as in `gather`: stop exchanging, keep training
            self._group = None
            log.warning("rank %d could not receive rank 0's text: %s", self.rank, error)
            return None
        return str(sent[0])

    def close(self) -> None:
        """Destroy the group after the last exchange; its threads are joined here, not at interpreter exit.

        Local to this rank (gloo's shutdown is no collective), so a rank may close while others still run.
        """
        # Ours are the last references: when `group` goes too, ProcessGroupGloo's destructor joins its threads.
        group, self._group, self._owned = self._owned, None, None
        if group is None:
            return
        try:
            dist.destroy_process_group(group)
        except Exception as error:  # the user destroyed every group already: nothing left to join
            log.debug("destroying the profiler's process group: %s", error)
        del group
        gc.collect()  # frees the group (a reference cycle in some torch versions): its threads are joined now
        self._buffers = {}
