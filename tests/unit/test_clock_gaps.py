"""Where the time between two batches goes (`BatchGaps`, `LoopTimer`), on timestamps the test sets by hand.

Lightning's part is played by hand: the loop timer stands in for a profiler that does nothing (as Lightning's
default), the test calls its `start`/`stop` around a fetch and enters its `profile` around a callback's hook as
Lightning's loop does. Times are multiples of 1/64 s: exact sums.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from anemoi_profiler.clock import BatchGaps, LoopTimer, OwnWorkClock
from anemoi_profiler.clock.intervals import GapTimes
from anemoi_profiler.trainer.lightning_private import CALLBACK_PREFIX, TRAIN_FETCH
from tests.helpers.clock_driver import ClockDriver, ManualTime


class IdleProfiler:
    """The trainer's profiler when the user set none: every call does nothing."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        yield action_name


def gaps_with_timer(time: ManualTime) -> tuple[BatchGaps, LoopTimer, OwnWorkClock]:
    own_work = OwnWorkClock(time)
    gaps, timer = BatchGaps(own_work, time), LoopTimer(IdleProfiler(), time)
    gaps.attach(timer, own_state_keys=frozenset())
    return gaps, timer, own_work


def fetch(timer: LoopTimer, time: ManualTime, seconds: float) -> None:
    timer.start(TRAIN_FETCH)
    time.advance(seconds)
    timer.stop(TRAIN_FETCH)


def hook(timer: LoopTimer, time: ManualTime, state_key: str, name: str, seconds: float) -> None:
    """A callback's hook as Lightning calls it: inside the trainer's profiler."""
    with timer.profile(f"{CALLBACK_PREFIX}{state_key}.{name}"):
        time.advance(seconds)


def test_a_gap_splits_into_other_callbacks_data_fetch_and_the_loop() -> None:
    """After our batch end: other callbacks' end hooks 1/64 s, loop 2/64, fetch 8/64, loop 4/64, other callbacks'
    start hooks 3/64. Callbacks 4/64, data wait 8/64, loop 6/64 (the 18/64 gap less the other two)."""
    time = ManualTime()
    gaps, timer, _ = gaps_with_timer(time)
    gaps.batch_started()
    time.advance(0.5)  # the step
    gaps.batch_ended("train", GapTimes(), sample_next_gap=False)
    hook(timer, time, "After", "on_train_batch_end", 1 / 64)
    time.advance(2 / 64)
    fetch(timer, time, 8 / 64)
    with timer.profile("[LightningModule]Model.on_train_batch_start"):  # no callback's: the loop's
        time.advance(4 / 64)
    hook(timer, time, "Before", "on_train_batch_start", 3 / 64)
    gaps.batch_started()
    time.advance(0.5)
    into = GapTimes()
    gaps.batch_ended("train", into, sample_next_gap=False)

    assert into == GapTimes(wait_s=8 / 64, callbacks_s=4 / 64, loop_s=6 / 64, fetches=1)


def test_own_work_in_the_gap_is_no_callbacks_or_loop_time() -> None:
    """A trace export of 0.25 s right after our batch end, then other callbacks 2/64 s and the loop 4/64: the
    export is in neither figure."""
    time = ManualTime()
    gaps, timer, own_work = gaps_with_timer(time)
    gaps.batch_started()
    gaps.batch_ended("train", GapTimes(), sample_next_gap=False)
    with own_work.measure():
        time.advance(0.25)
    hook(timer, time, "After", "on_train_batch_end", 2 / 64)
    time.advance(4 / 64)
    gaps.batch_started()
    into = GapTimes()
    gaps.batch_ended("train", into, sample_next_gap=False)

    assert into == GapTimes(wait_s=0.0, callbacks_s=2 / 64, loop_s=4 / 64, fetches=0)


def test_a_fetch_before_a_reset_is_no_batchs() -> None:
    """A fetch at an epoch's start (before `reset`) is not the next batch's data wait; the one after is."""
    time = ManualTime()
    gaps, timer, _ = gaps_with_timer(time)
    fetch(timer, time, 1.0)  # workers starting at the epoch's start
    gaps.reset()
    fetch(timer, time, 1 / 64)
    gaps.batch_started()
    into = GapTimes()
    gaps.batch_ended("train", into, sample_next_gap=False)
    assert (into.wait_s, into.fetches) == (1 / 64, 1)


def test_a_hook_inside_another_is_counted_once_and_the_profilers_own_not_at_all() -> None:
    """A checkpoint save of 4/64 s calls another callback's `on_save_checkpoint` (1/64 s of it) and the profiler's
    own; a profiler callback spends 1 s in its hook. Other callbacks' time: the checkpoint's 4/64 s alone."""
    time = ManualTime()
    gaps, timer, _ = gaps_with_timer(time)
    timer.leave_out(frozenset({"Ours"}))
    gaps.batch_started()
    gaps.batch_ended("train", GapTimes(), sample_next_gap=True)
    with timer.profile(f"{CALLBACK_PREFIX}ModelCheckpoint{{'every_n_train_steps': 1}}.on_train_batch_end"):
        time.advance(2 / 64)
        hook(timer, time, "Ema", "on_save_checkpoint", 1 / 64)
        hook(timer, time, "Ours", "on_save_checkpoint", 1 / 64)
    hook(timer, time, "Ours", "on_train_batch_start", 1.0)
    gaps.batch_started()
    into = GapTimes()
    gaps.batch_ended("train", into, sample_next_gap=False)

    assert (into.callbacks_s, into.loop_s) == (4 / 64, 1.0)
    assert gaps.callbacks_ms() == {"ModelCheckpoint{'every_n_train_steps': 1}": 62.5}


def test_a_sampled_gap_names_the_callbacks_in_it() -> None:
    """Once an interval the next gap is timed hook by hook: `Slow` spent 3/64 s there, 46.875 ms; the
    profiler's own callbacks are left out."""
    time = ManualTime()
    gaps, timer, _ = gaps_with_timer(time)
    timer.leave_out(frozenset({"Ours"}))
    gaps.batch_started()
    gaps.batch_ended("train", GapTimes(), sample_next_gap=True)
    for state_key, seconds in (("Slow", 3 / 64), ("Ours", 1.0)):
        hook(timer, time, state_key, "on_train_batch_end", seconds)
    gaps.batch_started()
    assert gaps.callbacks_ms() == {"Slow": 46.875}
    assert timer.profile == timer.wrapped.profile  # in the step, Lightning calls the real profiler directly


def test_data_wait_per_batch_over_an_interval(tmp_path: Path) -> None:
    """4 batches of 0.25 s, each fetched in 1/16 s before it starts. The first step after training starts is not
    steady (steps.json flags it) and is left out, fetch and all: the interval's data wait is 3/16 s over 3
    batches, 62.5 ms a batch, and the step time (fetch included) 312.5 ms."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0")
    timer = LoopTimer(IdleProfiler(), driver.time)
    driver.clock.gaps.attach(timer, own_state_keys=frozenset())
    driver.clock.train_start()
    for _ in range(4):
        fetch(timer, driver.time, 1 / 16)
        driver.train_batches(0.25)

    totals = driver.clock.totals["train"]
    assert (totals.fetches, totals.wait_s, totals.per_batch_ms(totals.wait_s)) == (3, 0.1875, 62.5)
    assert driver.recorder.intervals == [("train", 4, 3, 312.5)]
    assert (totals.left_out_batches, totals.left_out_s) == (1, 0.3125)  # its fetch with it


def test_an_epochs_first_fetch_is_its_epoch_start_not_data_wait(tmp_path: Path) -> None:
    """Two epochs of 2 batches of 0.25 s, each batch fetched in 1/16 s, except the second epoch's first, whose
    fetch starts the DataLoader workers: 2 s. Each epoch's first fetch is inside its epoch start (1/16 + 2 s);
    the data wait is the other two fetches (1/8 s). An epoch's first step is not steady (steps.json flags it) and
    is left out: the steady steps hold 0.5 s of batches and those two fetches, 0.625 s over 2 batches, 312.5 ms."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0")
    timer = LoopTimer(IdleProfiler(), driver.time)
    driver.clock.gaps.attach(timer, own_state_keys=frozenset())
    driver.clock.train_start()
    for first_fetch_s in (1 / 16, 2.0):
        driver.clock.train_epoch_start()
        for fetch_s in (first_fetch_s, 1 / 16):
            fetch(timer, driver.time, fetch_s)
            driver.train_batches(0.25)

    totals = driver.clock.totals["train"]
    assert (totals.wait_s, totals.fetches, totals.epoch_start_s, totals.elapsed_s) == (1 / 8, 2, 2.0625, 0.625)
    assert driver.recorder.intervals == [("train", 4, 2, 312.5)]


def test_a_watched_block_that_never_ran_is_cancelled() -> None:
    """`around_next` waits for a block by its action name; if Lightning never ran it (a renamed private name), the
    throughput callback cancels it at the first step's end, and Lightning calls the real profiler again."""
    timer = LoopTimer(IdleProfiler())
    timer.around_next("[_Renamed].run_training_batch", contextlib.nullcontext)
    assert timer.profile != timer.wrapped.profile
    assert timer.cancel_around()
    assert timer.profile == timer.wrapped.profile
    assert not timer.cancel_around()
