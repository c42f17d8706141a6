"""The benchmark's switch really leaves a trick of `tracking/startup.py` out (benchmarks/startup_tricks.py measures
each with and without it; a switch that did nothing would measure nothing), and the tricks do what they say."""

from __future__ import annotations

import pytest

from anemoi_profiler import ProfilerConfig, StepTimingCallback
from anemoi_profiler.tracking import sender, startup


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
