"""What the profiler needs to know about a Trainer, found by duck typing.

anemoi uses the `pytorch_lightning` namespace, most others `lightning.pytorch`; `isinstance` across the two
fails, so nothing here imports either.
"""

from __future__ import annotations

from typing import Any, Protocol

from anemoi_profiler.trainer import lightning_private


class TrainerLike(Protocol):
    """What the stage clock reads of a Trainer of either namespace (tests hand in stand-ins of this shape)."""

    @property
    def global_step(self) -> int: ...

    @property
    def sanity_checking(self) -> bool: ...

    @property
    def state(self) -> Any: ...


def find_mlflow_logger(trainer: Any) -> Any | None:
    """The trainer's MLflow logger (Lightning's MLFlowLogger or anything shaped like it), if any."""
    for logger in getattr(trainer, "loggers", None) or []:
        if lightning_private.is_mlflow_logger(logger):
            return logger
    return None


def logger_tracking_uri(logger: Any) -> str | None:
    return lightning_private.mlflow_logger_tracking_uri(logger)


def logger_prefix(logger: Any) -> str:
    return lightning_private.mlflow_logger_prefix(logger)


def global_rank(trainer: Any) -> int:
    return int(getattr(trainer, "global_rank", 0))


def local_rank(trainer: Any) -> int:
    return int(getattr(trainer, "local_rank", 0))


def node_rank(trainer: Any) -> int:
    return int(getattr(trainer, "node_rank", 0))


def world_size(trainer: Any) -> int:
    return int(getattr(trainer, "world_size", 1))


def num_devices(trainer: Any) -> int:
    """Devices per node the job trains on (the Trainer's `devices`)."""
    return int(getattr(trainer, "num_devices", 1))


def num_nodes(trainer: Any) -> int:
    return int(getattr(trainer, "num_nodes", 1))


def precision(trainer: Any) -> str:
    return str(getattr(trainer, "precision", "32-true"))


def strategy_name(trainer: Any) -> str:
    return type(getattr(trainer, "strategy", None)).__name__


SHARDING_STRATEGIES = ("FSDP", "DeepSpeed", "ModelParallel")
"""Strategies that shard parameters (and reduce-scatter gradients) across ranks, found by name in either
Lightning namespace."""


def sharding_strategy(trainer: Any) -> str | None:
    """The strategy's class name when it shards the model, else None."""
    name = strategy_name(trainer)
    return name if any(marker in name for marker in SHARDING_STRATEGIES) else None


def root_device(trainer: Any) -> Any:
    """The torch.device this rank trains on (cpu when unknown)."""
    import torch

    strategy = getattr(trainer, "strategy", None)
    device = getattr(strategy, "root_device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def global_step(trainer: Any) -> int:
    return int(getattr(trainer, "global_step", 0))


def train_dataloader_workers(trainer: Any) -> tuple[int, bool] | None:
    """The training DataLoaders' most `num_workers`, and whether all that have workers keep them between epochs
    (`persistent_workers`); None when the trainer has no DataLoader shaped like torch's."""
    found: list[Any] = []
    pending = [getattr(trainer, "train_dataloader", None)]
    while pending:
        item = pending.pop()
        if isinstance(getattr(item, "num_workers", None), int):
            found.append(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    if not found:
        return None
    with_workers = [loader for loader in found if loader.num_workers > 0]
    persistent = all(getattr(loader, "persistent_workers", False) for loader in with_workers)
    return max(loader.num_workers for loader in found), persistent
