"""How many samples and items a batch holds: the throughput callback's counting, done by the stage clock each batch.

Samples are dim 0 of the first tensor in the batch unless `batch_size_fn` says otherwise; items (tokens, grid
points) come from `length_fn`. Both are called inline, on the training thread: each Python call between torch's
operators costs microseconds, and a function that returns a CUDA tensor forces a sync (return Python ints).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import torch

from anemoi_profiler.logs import get_logger

log = get_logger(__name__)


class BatchCounter:
    def __init__(
        self, batch_size_fn: Callable[[Any], int] | None = None, length_fn: Callable[[Any], int] | None = None
    ) -> None:
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self._said: set[Hashable] = set()

    def count(self, batch: Any) -> tuple[int, int]:
        """(samples, items) in `batch`; a user function that raises leaves its count out (0), said once."""
        samples = items = None
        if self.batch_size_fn is not None:
            try:
                samples = int(self.batch_size_fn(batch))
            except Exception as error:
                self._failed("batch_size_fn", error)
        if samples is None:
            samples = batch_size_of(batch)
            if samples is None:
                log.warning_once(
                    self._said,
                    "samples",
                    "cannot find the batch size in a batch of type %s; set throughput.batch_size_fn "
                    "(samples/s not reported)",
                    type(batch).__name__,
                )
        if self.length_fn is not None:
            try:
                items = int(self.length_fn(batch))
            except Exception as error:
                self._failed("length_fn", error)
        return samples or 0, items or 0

    def _failed(self, name: str, error: Exception) -> None:
        log.warning_once(self._said, name, "%s raised %s: %s; its count is left out", name, type(error).__name__, error)


def batch_size_of(batch: Any) -> int | None:
    """Samples in a batch: dim 0 of the first tensor found in tensors, mappings, sequences or dataclasses."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    elif hasattr(batch, "__dataclass_fields__"):
        values = (getattr(batch, name) for name in batch.__dataclass_fields__)
    else:
        return None
    for value in values:
        size = batch_size_of(value)
        if size is not None:
            return size
    return None
