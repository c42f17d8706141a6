"""How the job's ranks split the work: how many data-parallel replicas see distinct samples.

Under DDP every rank reads its own samples. Under tensor parallelism, HSDP's replicas or anemoi's model groups
(`DDPGroupStrategy(num_gpus_per_model=...)`) several ranks work on the same samples, and a global rate that
summed every rank's samples would count them several times. Found by duck typing, so that `pytorch_lightning`
strategies (anemoi's) and `lightning.pytorch` ones are read alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anemoi_profiler.logs import get_logger

log = get_logger(__name__)

GROUP_ATTRIBUTES = ("ens_comm_group_size", "model_comm_group_size")
"""anemoi's strategies: the ranks of an ensemble group (or else a model group) share their input samples."""


@dataclass(frozen=True)
class Parallelism:
    world_size: int
    data_parallel_size: int
    source: str
    """How `data_parallel_size` was found, for the report."""

    @property
    def ranks_per_replica(self) -> int:
        return self.world_size // self.data_parallel_size


def detect_parallelism(strategy: Any, world_size: int, configured: int | str) -> Parallelism:
    """`distributed.data_parallel_size` when set, else what the strategy says, else one replica per rank."""
    if configured != "auto":
        if world_size % int(configured) == 0:
            return Parallelism(world_size, int(configured), "distributed.data_parallel_size")
        log.warning(
            "distributed.data_parallel_size=%s does not divide the world size %d; global rates "
            "count every rank's samples instead",
            configured,
            world_size,
        )
        return Parallelism(world_size, world_size, "world size (distributed.data_parallel_size did not divide it)")
    for attribute in GROUP_ATTRIBUTES:
        size = getattr(strategy, attribute, None)
        if isinstance(size, int) and size > 1 and world_size % size == 0:
            return Parallelism(world_size, world_size // size, f"{type(strategy).__name__}.{attribute}={size}")
    try:
        replicas = (getattr(strategy, "distributed_sampler_kwargs", None) or {}).get("num_replicas")
    except Exception:  # a strategy whose property needs what it has not set up yet
        replicas = None
    if isinstance(replicas, int) and 1 <= replicas <= world_size and world_size % replicas == 0:
        return Parallelism(world_size, replicas, f"the sampler replicas of {type(strategy).__name__}")
    return Parallelism(world_size, world_size, "world size")
