"""The parts of a post-mortem without a fit: where a thread is, who holds a stall, the signal handlers' chain,
and the config keys."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anemoi_profiler import ProfilerConfig
from anemoi_profiler.config import ConfigError
from anemoi_profiler.postmortem import PostmortemRecorder
from anemoi_profiler.postmortem.signals import SignalRecorder
from anemoi_profiler.postmortem.stacks import describe, phase_of, thread_stacks, user_frame
from anemoi_profiler.postmortem.watchdog import AUTO_MIN_S, Progress, StallWatchdog
from anemoi_profiler.run_files.postmortem_files import merge_stall

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


def part(rank: int, phase: str, step: int = 40, frame: str = "f (x.py:1)") -> dict[str, Any]:
    return {"rank": rank, "episode": 1, "phase": phase, "frame": frame, "last_step": step, "stalled_for_s": 300.0}


def test_the_ranks_outside_a_collective_hold_those_in_it() -> None:
    parts = [part(rank, "backward: gradient all-reduce") for rank in range(8) if rank != 5]
    parts.append(part(5, "data fetch", frame="__next__ (dataset.py:12)"))
    merged = merge_stall(parts, 8)
    assert merged["holding_ranks"] == [5] and merged["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert merged["summary"] == (
        "stalled after step 40: rank 5 in data fetch at __next__ (dataset.py:12); "
        "ranks 0,1,2,3,4,6,7 waiting in backward: gradient all-reduce"
    )


def test_when_every_rank_that_wrote_waits_the_silent_ones_hold_them() -> None:
    merged = merge_stall([part(0, "collective (all_reduce)"), part(2, "collective (all_reduce)")], 3)
    assert merged["missing_ranks"] == [1] and merged["holding_ranks"] == [1]
    assert "rank 1 wrote no part (dead, or not stalled)" in merged["summary"]


def test_without_a_collective_the_rank_in_another_phase_stands_out() -> None:
    merged = merge_stall([part(0, "data fetch"), part(1, "data fetch"), part(2, "checkpoint")], 3)
    assert merged["holding_ranks"] == [2] and merged["waiting_ranks"] == []


def training_step(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(30)


def test_a_thread_in_its_training_step_reads_as_forward_at_the_users_frame() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=training_step, args=(ready, release), name="trainer")
    thread.start()
    try:
        ready.wait(30)
        time.sleep(0.05)
        stack = next(t["stack"] for t in thread_stacks() if t["name"] == "trainer")
    finally:
        release.set()
        thread.join()
    assert phase_of(stack) == "forward (training_step)"
    assert describe(user_frame(stack)).startswith("training_step (test_records.py:")


@pytest.fixture
def restored_sigusr1() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, handler)


def test_the_recorder_runs_first_then_the_handler_that_was_there(restored_sigusr1: None) -> None:
    calls: list[str] = []

    def previous(signum: int, frame: Any) -> None:
        calls.append("previous")

    signal.signal(signal.SIGUSR1, previous)
    recorder = SignalRecorder(lambda signum, frame, ends: calls.append(f"recorded {signum.name}, ends {ends}"))
    recorder.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.1)  # Python runs the handler at the next bytecode
    assert calls == ["recorded SIGUSR1, ends False", "previous"]
    recorder.restore()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_a_signal_ignored_before_stays_ignored(restored_sigusr1: None) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    recorder = SignalRecorder(lambda signum, frame, ends: None)
    recorder.install()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


@pytest.mark.parametrize("value", ["soon", "0", "-5", "true"])
def test_stall_after_s_is_auto_or_seconds(value: str) -> None:
    with pytest.raises(ConfigError, match=r"postmortem\.stall_after_s"):
        ProfilerConfig.load(None, [f"postmortem.stall_after_s={value}"])
    assert ProfilerConfig.load(None, ["postmortem.stall_after_s=2.5"]).postmortem.stall_after_s == 2.5


def watchdog(stall_after_s: float | str, recent_steps_s: list[float], tmp_path: Path) -> StallWatchdog:
    progress = Progress(lambda: 0, lambda: 0, lambda: recent_steps_s, lambda: False)
    return StallWatchdog(tmp_path, 0, 1, stall_after_s, progress)


def test_the_automatic_threshold_is_five_minutes_or_a_hundred_median_steps(tmp_path: Path) -> None:
    assert watchdog("auto", [], tmp_path).threshold_s() == AUTO_MIN_S == 300.0  # before the first step
    assert watchdog("auto", [0.1, 0.2, 9.0], tmp_path).threshold_s() == 300.0
    assert watchdog("auto", [4.0, 5.0, 6.0], tmp_path).threshold_s() == 500.0  # 100 median steps
    assert watchdog(2.5, [4.0], tmp_path).threshold_s() == 2.5


def test_a_disabled_post_mortem_starts_no_thread_and_sets_no_handler(tmp_path: Path, restored_sigusr1: None) -> None:
    recorder = PostmortemRecorder(ProfilerConfig.load(None, ["postmortem.enabled=false"]).postmortem)
    before = signal.getsignal(signal.SIGUSR1)
    recorder.start(tmp_path, 0, 1, None, None)
    recorder.train_started(trainer=None, clock=None)
    assert "anemoi-profiler-watchdog" not in [thread.name for thread in threading.enumerate()]
    assert signal.getsignal(signal.SIGUSR1) == before
    recorder.close()
    assert not (tmp_path / "postmortem").exists()
