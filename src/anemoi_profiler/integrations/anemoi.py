"""The whole profiler as ONE entry of anemoi-training's `diagnostics.callbacks` (docs/anemoi.md).

anemoi-training builds each entry of `diagnostics.callbacks` with Hydra's `instantiate`, one callback per entry,
and its pydantic schema refuses a section of its own (`diagnostics.profiler`). `AnemoiProfiler` takes the
profiler's config as its arguments (accepted there as they are) and, in `setup`, puts the callbacks of
`build_callbacks` right after itself in `trainer.callbacks`, so Lightning calls them from that `setup` on, as
if they had been listed. Grid points are counted per sample over the full grid, also when anemoi shards it,
and the model summary runs the forward pass on the inputs anemoi's step makes of a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from anemoi_profiler.build import build_callbacks
from anemoi_profiler.callbacks.base import Callback, ProfilerCallback
from anemoi_profiler.config import PRESETS, ConfigError, ProfilerConfig, preset_path
from anemoi_profiler.logs import get_logger

log = get_logger(__name__)


def grid_points_counter(pl_module: Any) -> Callable[[Any], int]:
    """`length_fn` for anemoi batches: samples x full grid points, summed over the datasets of the batch.

    anemoi's batch maps each dataset name to a tensor (batch, time, ensemble, grid, variables). Under a model
    group with `keep_batch_sharded` a rank holds only its shard of the grid, so the full size comes from the
    module's `grid_sizes` (the graph's data nodes) where it has one; else from the tensor's grid dimension.
    """
    full_sizes = {str(name): int(size) for name, size in (getattr(pl_module, "grid_sizes", None) or {}).items()}

    def grid_points(batch: Any) -> int:
        tensors = batch.items() if isinstance(batch, Mapping) else [(None, batch)]
        return sum(int(tensor.shape[0]) * full_sizes.get(str(name), int(tensor.shape[-2])) for name, tensor in tensors)

    return grid_points


def model_inputs(pl_module: Any) -> Callable[[Any], tuple[Any]]:
    """`input_fn` for the model summary: the inputs anemoi's own step gives its module (`task.get_inputs`).

    The summary runs one forward pass on rank 0 alone; in a model group that forward would wait for the group's
    other ranks, so there it raises instead, and the summary keeps the parameter counts (saying why).
    """

    def inputs(batch: Any) -> tuple[Any]:
        if getattr(pl_module, "model_comm_group_size", 1) > 1:
            raise RuntimeError("in a model group the forward pass needs every rank of the group")
        return (pl_module.task.get_inputs(batch, data_indices=pl_module.data_indices),)

    return inputs


class AnemoiProfiler(Callback):
    """All the profiler's callbacks from one `diagnostics.callbacks` entry of an anemoi-training config.

    `preset` (`simple` or `detailed`) is the starting point, `config` the keys of the profiler's tree that
    differ from it (as in a YAML config file; docs/configuration.md), `overrides` `key=value` strings on top.
    The config is checked here, so a typo fails when anemoi builds its callbacks, before training.

    Args:
        preset: The preset the config starts from: `simple` or `detailed`.
        config: Keys of the profiler's tree merged over the preset; None: the preset as it is.
        overrides: `key=value` strings applied last.

    Raises:
        ConfigError: An unknown preset or an invalid config.
    """

    def __init__(
        self, preset: str = "simple", config: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
    ) -> None:
        if preset not in PRESETS:
            raise ConfigError(f"preset {preset!r}: not a preset (presets: {', '.join(PRESETS)})")
        tree = OmegaConf.merge(OmegaConf.load(preset_path(preset)), OmegaConf.create(dict(config or {})))
        assert isinstance(tree, DictConfig)  # merged from two mappings
        self.config = ProfilerConfig.load(tree, list(overrides))
        self.members: list[ProfilerCallback] = []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.members:
            return  # a later fit, validate or test of the same trainer: the members are in its list already
        try:
            self.members = build_callbacks(
                self.config, length_fn=grid_points_counter(pl_module), input_fn=model_inputs(pl_module)
            )
        except Exception as error:
            log.warning("not profiling, could not build its callbacks: %s (training goes on)", error)
            return
        # Lightning iterates `trainer.callbacks` itself while calling `setup`: the members come next in that loop.
        position = trainer.callbacks.index(self) + 1
        trainer.callbacks[position:position] = self.members
