"""The benchmark's switch really leaves a trick of `tracking/startup.py` out (benchmarks/startup_tricks.py measures
each with and without it; a switch that did nothing would measure nothing), and the tricks do what they say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

from anemoi_profiler import ProfilerConfig, StepTimingCallback, build_callbacks, names
from anemoi_profiler.callbacks.stage_callback import StageCallback
from anemoi_profiler.run.clock import LoopTimer
from anemoi_profiler.tracking import sender, startup
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


def test_a_callback_leaves_lightning_only_the_batch_hooks_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ProfilerConfig.load(None, ["tracking.enabled=false"])
    callback = StepTimingCallback(config)
    assert callback.on_before_backward is None and callback.on_predict_batch_end is None
    monkeypatch.setenv(startup.WITHOUT_VARIABLE, "hooks_none")
    assert callable(StepTimingCallback(config).on_before_backward)


def test_a_released_sender_is_kept_for_the_next_run_unless_the_trick_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sender.end_kept()
    first, second = sender._spawn(None, idle_exit_s=30), sender._spawn(None, idle_exit_s=30)
    try:
        monkeypatch.setenv(startup.WITHOUT_VARIABLE, "kept_sender")
        assert not startup.keep_for_next_run(first)
        monkeypatch.delenv(startup.WITHOUT_VARIABLE)
        assert startup.keep_for_next_run(first) and startup.waiting() == first._replace(ready=True)
        assert not startup.keep_for_next_run(second)  # one sender waits at a time
    finally:
        sender.end_kept()
        for spawned in (first, second):
            if spawned.process.poll() is None:
                sender._end(spawned.process, spawned.replies, grace_s=5.0)
    assert startup.waiting() is None


class _ClockHooksSeen(pl.Callback):
    """Which of the profiler's stage callbacks have a batch hook Lightning would call, batch by batch."""

    def __init__(self, ours: list[Any]) -> None:
        self.stages = [callback for callback in ours if isinstance(callback, StageCallback)]
        self.callable: list[list[str]] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.callable.append([type(c).__name__ for c in self.stages if callable(c.on_train_batch_end)])


@pytest.mark.parametrize("without", ["", "hooks_none"])
def test_only_the_callback_that_drives_the_clock_keeps_its_batch_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without: str
) -> None:
    monkeypatch.setenv(startup.WITHOUT_VARIABLE, without)
    config = ProfilerConfig.load(
        None, [f"output_dir={tmp_path}", "tracking.enabled=false", "log_every_n_steps=2", "throughput.warmup_steps=1"]
    )
    ours = build_callbacks(config)
    for run in range(2):  # a later run's setup gives the hooks back, and one callback drives again
        seen = _ClockHooksSeen(ours)
        names_of_stages = [type(c).__name__ for c in seen.stages]
        assert len(names_of_stages) == 2
        trainer([*ours, seen], max_steps=4, limit_val_batches=0).fit(TinyRegressor(), loaders(n_train=64)[0])
        assert seen.callable == [names_of_stages if without else names_of_stages[:1]] * 4, run
        run_dir = ours[0].session.run_dir
        logged = json.loads((run_dir / "metrics.json").read_text())
        assert names.TRAIN_SAMPLES_PER_SEC in logged and names.TRAIN_STEP_MS in logged  # both callbacks' metrics


def test_the_stand_in_for_lightnings_do_nothing_profiler_does_nothing_more_cheaply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timer = LoopTimer(PassThroughProfiler())
    assert timer.profile("[Callback]A.on_train_batch_end") is timer.profile("run_training_batch")  # one shared nothing
    timer.start_sample()
    with timer.profile("[Callback]A.on_train_batch_end"):
        pass
    assert set(timer.end_sample()) == {"A"}  # a sampled gap still times each callback
    assert timer.profile("x") is timer.profile("y")  # and then does nothing cheaply again
    simple = SimpleProfiler()
    with LoopTimer(simple).profile("a user's profiler still profiles"):
        pass
    assert "a user's profiler still profiles" in simple.recorded_durations
    monkeypatch.setenv(startup.WITHOUT_VARIABLE, "quiet_profiler")
    assert LoopTimer(PassThroughProfiler()).profile("x") is not LoopTimer(PassThroughProfiler()).profile("x")
