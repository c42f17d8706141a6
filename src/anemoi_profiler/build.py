"""Turn a config into the list of callbacks that share one session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anemoi_profiler.callbacks import (
    HtaCallback,
    MemorySnapshotCallback,
    ModelSummaryCallback,
    ProfilerCallback,
    StepTimingCallback,
    SystemMetricsCallback,
    ThroughputCallback,
    TorchProfilerCallback,
)
from anemoi_profiler.config import ConfigSource, ProfilerConfig
from anemoi_profiler.run.session import ProfilerSession


def build_callbacks(
    config: ProfilerConfig | ConfigSource | None = None,
    *,
    length_fn: Callable[[Any], int] | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    input_fn: Callable[[Any], Any] | None = None,
) -> list[ProfilerCallback]:
    """The enabled callbacks for `config` (defaults if None), sharing one run folder, MLflow run and report.

    `config` may also be what `ProfilerConfig.load` reads: a preset name, a YAML path, a mapping, or the
    section of a Hydra tree (`build_callbacks(cfg.diagnostics.profiler)`).

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads. None: the defaults.
        length_fn: Counts the items (tokens, grid points) of a batch for `items_per_sec`; None: no item rates
            unless `throughput.length_fn` names one (see `ThroughputCallback`).
        batch_size_fn: Counts the samples of a batch; None: dim 0 of the batch's first tensor.
        input_fn: Turns a batch into the model's forward arguments for the model summary; None: the default
            rule (see `ModelSummaryCallback`).

    Returns:
        The callbacks to pass to `Trainer(callbacks=...)` on every rank; never empty (with everything disabled,
        a base callback still writes the run folder).

    Raises:
        ConfigError: The config is invalid (unknown key, wrong type, out-of-range value).
    """
    config = ProfilerConfig.ensure(config)
    session = ProfilerSession(config)
    callbacks: list[ProfilerCallback] = []
    if config.throughput.enabled:
        callbacks.append(ThroughputCallback(session=session, length_fn=length_fn, batch_size_fn=batch_size_fn))
    if config.timing.enabled:
        callbacks.append(StepTimingCallback(session=session))
    if config.system.enabled:
        callbacks.append(SystemMetricsCallback(session=session))
    if config.model_summary.enabled:
        callbacks.append(ModelSummaryCallback(session=session, input_fn=input_fn))
    if config.memory_snapshot.enabled:
        callbacks.append(MemorySnapshotCallback(session=session))
    if config.profiler.enabled or config.triggers.enabled:  # triggered windows need the profiler's callback
        callbacks.append(TorchProfilerCallback(session=session, scheduled=config.profiler.enabled))
    if config.hta.enabled:
        callbacks.append(HtaCallback(session=session))  # last: it reads the traces the others wrote
    if not callbacks:
        # Nothing measured still leaves a run folder, config copy and environment: a callback-less base.
        callbacks.append(ProfilerCallback(session=session))
    return callbacks
