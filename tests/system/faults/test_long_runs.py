"""Long runs: the profiler's own memory stays bounded over 100k steps; no thread or file handle outlives a fit."""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from anemoi_profiler import build_callbacks, names, wait_for_mlflow
from anemoi_profiler.callbacks.stage_callback import StageCallback
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer
from tests.system.faults.fault_helpers import metric_steps, only_run, quick_config

pytestmark = [pytest.mark.faults, pytest.mark.soak]  # a long suite: make soak (CI)

ALLOWED_GROWTH_BYTES = 128 * 1024
"""Over 50k steps: a leak of 3 bytes per step, or of 128 bytes per log interval, would exceed it."""
HISTORY_POINTS = 20
"""metrics.json keeps this many points per key here (4000 by default), so that the run reaches the cap."""


def profiler_bytes() -> int:
    """Live bytes allocated by anemoi_profiler's own lines since tracemalloc started.

    A full collection first empties CPython's free lists, which would otherwise keep freed tuples and floats
    counted where they were allocated.
    """
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*anemoi_profiler*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


@pytest.mark.slow
def test_profiler_buffers_stay_bounded_over_100k_training_steps(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    """The callbacks' hooks run 100k times on a real Trainer, as a fit calls them; the MLflow store is real.

    A real fit of 100k steps takes minutes on CPU; here only the optimizer step is left out (the step
    counter that `trainer.global_step` reads is advanced as Lightning's optimizer loop does).
    """
    store = new_store(tmp_path / "store" / "mlflow.db")
    config = quick_config(
        tmp_path / "runs", f"tracking.uri={store}", "log_every_n_steps=50", "tracking.flush_interval_s=0.5"
    )
    callbacks = build_callbacks(config)
    model, fit = TinyRegressor(), trainer(callbacks)
    optimizer_steps = fit.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step
    batch = (torch.zeros(16, 8), torch.zeros(16, 1))

    def hooks(name: str, *args: Any) -> None:
        # As Lightning calls them: every callback of the trainer's list, read anew (the session puts the clock's
        # callback into it at setup).
        for callback in list(fit.callbacks):
            getattr(callback, name)(fit, model, *args)

    def train(first: int, last: int) -> None:
        for index in range(first, last):
            hooks("on_train_batch_start", batch, index)
            optimizer_steps.increment_completed()
            hooks("on_train_batch_end", None, batch, index)

    hooks("setup", "fit")
    hooks("on_train_start")
    session = callbacks[0].session
    session.history.max_points = HISTORY_POINTS
    train(0, 10_000)  # first intervals, MLflow connection, caches
    tracemalloc.start()
    try:
        train(10_000, 50_000)
        session.sink.flush(timeout_s=120)
        middle = profiler_bytes()
        train(50_000, 100_000)
        session.sink.flush(timeout_s=120)
        end = profiler_bytes()
    finally:
        tracemalloc.stop()
    # By design each log interval leaves its numbers in the steady figures' columns (8 bytes each); nothing else.
    by_design = sum(
        8 * log.columns * 50_000 // 50 for callback in callbacks for log in getattr(callback, "intervals", {}).values()
    )
    kept = end - middle - by_design
    assert kept < ALLOWED_GROWTH_BYTES, f"the profiler kept {kept} more bytes than its columns after 50k more steps"
    for callback in callbacks:
        if isinstance(callback, StageCallback):
            meter = callback.meters["train"]
            assert not meter._pending and len(meter._segments) <= 1  # nothing kept from earlier intervals
    assert all(len(points) <= HISTORY_POINTS for points in session.history._points.values())
    hooks("on_train_end")
    hooks("teardown", "fit")

    run = only_run(store)
    assert run.info.status == "FINISHED"
    assert metric_steps(store, run.info.run_id, names.TRAIN_STEP_MS) == list(range(50, 100_001, 50))


def open_file_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
def test_no_profiler_thread_or_file_handle_outlives_a_fit(tmp_path: Path, new_store: Callable[[Path], str]) -> None:
    store = new_store(tmp_path / "store" / "mlflow.db")
    config = quick_config(
        tmp_path / "runs",
        f"tracking.uri={store}",
        "profiler.enabled=true",
        "profiler.train.skip_first=0",
        "profiler.train.wait=0",
        "profiler.train.warmup=1",
        "profiler.train.active=2",
    )

    def fit_once(fail_at_step: int | None = None) -> None:
        train, _ = loaders(n_train=16 * 8)
        try:
            trainer(build_callbacks(config)).fit(TinyRegressor(fail_at_step=fail_at_step), train)
        finally:
            wait_for_mlflow()  # what a short fit leaves to the background

    fit_once()  # MLflow keeps its connections to the store for the process: open them first
    threads = {thread.ident for thread in threading.enumerate()}
    descriptors = open_file_descriptors()
    fit_once()
    with pytest.raises(RuntimeError, match="boom"):
        fit_once(fail_at_step=3)

    left = [thread.name for thread in threading.enumerate() if thread.ident not in threads]
    assert not left, f"threads still running after the fits: {left}"
    assert open_file_descriptors() <= descriptors
