"""The stage clock's arithmetic, driven through its hooks with timestamps the test sets by hand.

No Trainer and no fit (see `ClockDriver`). Every expected figure is worked out in the test's docstring; times are
multiples of 1/8 s, so the sums are exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from anemoi_profiler.clock import RankTotals
from anemoi_profiler.run_files.steps_file import PROFILED, WARMUP
from tests.helpers.clock_driver import ClockDriver, ManualTime


def test_warmup_batches_are_left_out_and_intervals_close_every_n_batches(tmp_path: Path) -> None:
    """2 warmup batches of 1 s, then 6 of 0.25 s with `log_every_n_steps=3`: two intervals at global steps 5 and 8, each
    3 batches in 0.75 s = 250 ms; the warmup's 2 s are in neither. Training ends on an interval boundary: no
    third interval."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=3", "throughput.warmup_steps=2")
    driver.clock.train_start()
    driver.train_batches(1.0, 1.0, *[0.25] * 6)
    driver.clock.train_end(driver.trainer)

    assert driver.recorder.intervals == [("train", 5, 3, 250.0), ("train", 8, 3, 250.0)]
    totals = driver.clock.totals["train"]
    assert (totals.batches, totals.samples, totals.elapsed_s, totals.step_ms) == (6, 48, 1.5, 250.0)


def test_the_last_interval_closes_at_the_end_of_training(tmp_path: Path) -> None:
    """No warmup, `log_every_n_steps=4`, 5 batches of 0.5 s: an interval of 4 batches and, at the end, one of the
    remaining single batch (500 ms). The first step after training starts is not steady (steps.json flags it): the
    first interval counts 3 steady batches (500 ms), and the step left out."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0")
    driver.clock.train_start()
    driver.train_batches(*[0.5] * 5)
    driver.clock.train_end(driver.trainer)
    assert driver.recorder.intervals == [("train", 4, 3, 500.0), ("train", 5, 1, 500.0)]
    totals = driver.clock.totals["train"]
    assert (totals.batches, totals.left_out_batches, totals.left_out_s, totals.all_in_s) == (4, 1, 0.5, 2.5)


def test_validation_time_is_kept_out_of_the_training_clock(tmp_path: Path) -> None:
    """2 training batches of 0.5 s; a validation of 3 s before its first batch and 2 batches of 0.125 s; 2 more
    training batches of 0.5 s. Training's interval: 4 batches, of which the first after training starts and the
    first after validation are not steady (left out): 2 batches in 1 s = 500 ms (the 3.25 s of validation out,
    of the all-in time too); validation's: 2 batches in 0.25 s = 125 ms (its 3 s before the first batch out)."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0")
    driver.clock.train_start()
    driver.train_batches(0.5, 0.5)
    driver.validation(0.125, 0.125, before_first_batch=3.0)
    driver.train_batches(0.5, 0.5)

    assert driver.recorder.intervals == [("val", 2, 2, 125.0), ("train", 4, 2, 500.0)]
    assert driver.clock.totals["val"].elapsed_s == 0.25
    assert driver.clock.totals["train"].all_in_s == 2.0


def test_the_sanity_check_makes_no_validation_interval(tmp_path: Path) -> None:
    """The sanity check's 2 batches make no validation interval; training's 2 batches of 0.5 s make one of 500 ms
    (the first after training starts left out)."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=2", "throughput.warmup_steps=0")
    driver.trainer.sanity_checking = True
    driver.validation(0.25, 0.25)
    driver.trainer.sanity_checking = False
    driver.clock.train_start()
    driver.train_batches(0.5, 0.5)
    assert driver.recorder.intervals == [("train", 2, 1, 500.0)]
    assert driver.clock.totals["val"].batches == 0


def test_with_gradient_accumulation_intervals_count_batches_and_intervals_carry_the_optimizer_step(
    tmp_path: Path,
) -> None:
    """`accumulate_grad_batches=2`: an optimizer step every 2 batches. `log_every_n_steps=4` and the warmup count
    batches: after a warmup of 2 batches, 8 batches of 0.25 s give 2 intervals of 4 batches, 250 ms a batch, at
    global (optimizer) steps 3 and 5."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=2")
    driver.clock.train_start()
    driver.train_batches(*[1.0] * 2, *[0.25] * 8, batches_per_step=2)
    assert driver.recorder.intervals == [("train", 3, 4, 250.0), ("train", 5, 4, 250.0)]


def test_epoch_starts_pause_the_training_clock(tmp_path: Path) -> None:
    """Two epochs of 2 batches of 0.5 s; the second epoch's DataLoader workers take 2 s to start. The interval counts
    4 batches; each epoch's first step is not steady (steps.json flags it) and is left out: 2 steady batches in
    1 s = 500 ms. The 2 s are the interval's epoch start, counted twice (the first epoch's start took no time);
    the all-in time holds the 4 batches and the epoch start: 4 s."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0")
    driver.clock.train_start()
    for _ in range(2):
        driver.clock.train_epoch_start()
        driver.time.advance(0.0 if driver.batches == 0 else 2.0)
        driver.train_batches(0.5, 0.5)

    assert driver.recorder.intervals == [("train", 4, 2, 500.0)]
    totals = driver.clock.totals["train"]
    assert (totals.elapsed_s, totals.epoch_start_s, totals.epoch_starts) == (1.0, 2.0, 2)
    assert (totals.left_out_batches, totals.left_out_s, totals.all_in_s) == (2, 1.0, 4.0)


@pytest.mark.parametrize("validation", [False, True], ids=["no validation", "validation at the epoch's end"])
def test_epoch_end_hooks_go_with_the_next_epochs_first_step(tmp_path: Path, validation: bool) -> None:
    """Two epochs of 3 batches of 0.5 s (optionally a validation after the first); between them 1 s of epoch-end
    hooks (a checkpoint saved at the epoch's end) and a 2 s epoch start. That 1 s is the next epoch's first step's
    time, as a clock between batch ends reads it: left out with that step, never a steady step's. The interval of
    6 batches holds 4 steady ones in 2 s = 500 ms; left out: the first after training starts (0.5 s) and the
    second epoch's first (1 s + 0.5 s); all-in: 4 s of steps and hooks and the 2 s epoch start."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=6", "throughput.warmup_steps=0")
    driver.clock.train_start()
    driver.clock.train_epoch_start()
    driver.train_batches(0.5, 0.5, 0.5)
    if validation:
        driver.validation(0.125, 0.125)
    driver.time.advance(1.0)  # other callbacks' on_train_epoch_end, a checkpoint
    driver.clock.train_epoch_start()
    driver.time.advance(2.0)  # the DataLoader's workers start again
    driver.train_batches(0.5, 0.5, 0.5)

    assert ("train", 6, 4, 500.0) in driver.recorder.intervals
    totals = driver.clock.totals["train"]
    assert (totals.elapsed_s, totals.left_out_batches, totals.left_out_s) == (2.0, 2, 2.0)
    assert (totals.epoch_start_s, totals.all_in_s) == (2.0, 6.0)


def test_the_profilers_own_work_is_taken_out_of_the_interval(tmp_path: Path) -> None:
    """4 batches of 0.25 s and, after the second, a trace export of 0.5 s: the interval holds 1.5 s, of which 0.5 s
    own work. The step with the own work and the first after training starts are not steady (steps.json flags
    them) and are left out, less the own work (taken out once): 0.5 s over 2 batches = 250 ms."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0")
    driver.clock.train_start()
    driver.train_batches(0.25, 0.25)
    with driver.own_work.measure():
        driver.time.advance(0.5)
    driver.train_batches(0.25, 0.25)

    assert driver.recorder.intervals == [("train", 4, 2, 250.0)]
    totals = driver.clock.totals["train"]
    assert (totals.elapsed_s, totals.own_work_s, totals.left_out_s, totals.all_in_s) == (0.5, 0.5, 0.5, 1.5)


def test_a_profiling_windows_steps_are_left_out_of_the_steady_figures(tmp_path: Path) -> None:
    """After a warmup batch of 1 s, 5 batches with `log_every_n_steps=5`: 0.25 s, two steps of a torch.profiler
    window (flagged `profiled` as they run) of 2 s each, 0.25 s and 0.25 s. The interval counts 5 batches; the
    window's 2 are left out: 3 steady batches in 0.75 s = 250 ms. The all-in time holds all 5: 4.75 s."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=5", "throughput.warmup_steps=1")
    driver.clock.train_start()
    driver.train_batches(1.0, 0.25)
    for _ in range(2):
        driver.clock.steps.mark("train", PROFILED)
        driver.train_batches(2.0)
    driver.train_batches(0.25, 0.25)

    assert driver.recorder.intervals == [("train", 6, 3, 250.0)]
    totals = driver.clock.totals["train"]
    assert (totals.batches, totals.elapsed_s, totals.left_out_batches, totals.left_out_s) == (3, 0.75, 2, 4.0)
    assert (totals.all_in().batches, totals.all_in().elapsed_s) == (5, 4.75)
    _, flags = driver.clock.steps.stages["train"].recorded()
    assert totals.batches == sum(1 for flag in flags if flag == 0)  # the steady steps are steps.json's


class OtherRankExchange:
    """Stands in for a two-rank `RankExchange`: rank 1 reports the same `RankTotals` every interval."""

    world_size = 2

    def __init__(self, other: RankTotals) -> None:
        self.other = other

    def gather(self, values: list[float]) -> list[list[float]]:
        return [list(values), self.other.to_list()]


def test_another_ranks_own_work_is_taken_out_of_every_rank(tmp_path: Path) -> None:
    """Rank 1 exported a trace for 0.5 s; rank 0 waited for it in the next all-reduce, so its 4 batches took 2.5 s.
    Both lose the slowest rank's 0.5 s: 2 s over 4 batches = 500 ms on each; rank 0 leaves its first step after
    training starts out (steps.json flags it): 1.5 s over 3 batches."""
    rank_1 = RankTotals(batches=4, samples=32, elapsed_s=2.5, own_work_s=0.5)
    driver = ClockDriver(
        tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0", exchange=OtherRankExchange(rank_1)
    )
    driver.clock.train_start()
    driver.train_batches(0.5, 0.5, 1.0, 0.5)  # the third batch waited for rank 1

    assert driver.recorder.intervals == [("train", 4, 3, 500.0)]
    (ranks,) = driver.recorder.ranks
    assert ranks is not None
    assert [(rank.elapsed_s, rank.step_ms) for rank in ranks] == [(1.5, 500.0), (2.0, 500.0)]


def test_another_ranks_longer_epoch_start_is_left_out_with_the_first_step_once(tmp_path: Path) -> None:
    """Rank 1's second epoch start took 2 s, rank 0's none: rank 0 waited for it in that epoch's first all-reduce
    (a 2.5 s step). Every rank leaves the epoch's first step out, the wait with it, and nothing more: 2 steady
    batches of 0.5 s on each rank (500 ms); the longest epoch start (2 s) is every rank's."""
    rank_1 = RankTotals(
        batches=2, samples=16, elapsed_s=2.0, epoch_start_s=2.0, epoch_starts=2, left_out_batches=2, left_out_s=1.0
    )
    driver = ClockDriver(
        tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0", exchange=OtherRankExchange(rank_1)
    )
    driver.clock.train_start()
    driver.clock.train_epoch_start()
    driver.train_batches(0.5, 0.5)
    driver.clock.train_epoch_start()
    driver.train_batches(2.5, 0.5)  # the first waited 2 s for rank 1

    assert driver.recorder.intervals == [("train", 4, 2, 500.0)]
    (ranks,) = driver.recorder.ranks
    assert ranks is not None
    assert [(rank.elapsed_s, rank.step_ms, rank.epoch_start_s) for rank in ranks] == [
        (1.0, 500.0, 2.0),
        (1.0, 500.0, 2.0),
    ]


def test_another_ranks_validation_own_work_stays_its_own(tmp_path: Path) -> None:
    """Validation steps have no collective: rank 1 exported a trace for 2 s (its 2 batches took 2.25 s) while
    rank 0's 2 batches took 0.25 s without waiting. Each loses its own work alone: 125 ms a batch on both."""
    rank_1 = RankTotals(batches=2, samples=16, elapsed_s=2.25, own_work_s=2.0)
    driver = ClockDriver(
        tmp_path, "log_every_n_steps=4", "throughput.warmup_steps=0", exchange=OtherRankExchange(rank_1)
    )
    driver.clock.train_start()
    driver.train_batches(0.5, 0.5)
    driver.validation(0.125, 0.125)

    assert ("val", 2, 2, 125.0) in driver.recorder.intervals
    ranks = driver.recorder.ranks[-1]
    assert ranks is not None
    assert [(rank.elapsed_s, rank.step_ms) for rank in ranks] == [(0.25, 125.0), (0.25, 125.0)]


class WaitingExchange(OtherRankExchange):
    """A two-rank exchange in which this rank waits `wait_s` for the other before the gather returns."""

    def __init__(self, other: RankTotals, time: ManualTime, wait_s: float) -> None:
        super().__init__(other)
        self.time, self.wait_s = time, wait_s

    def gather(self, values: list[float]) -> list[list[float]]:
        self.time.advance(self.wait_s)
        return super().gather(values)


def test_a_validation_exchanges_wait_is_the_profilers_own_work(tmp_path: Path) -> None:
    """4 validation batches of 0.125 s, an exchange every 2: rank 0 waits 1 s in each exchange for rank 1. Without
    the profiler validation's ranks would not meet, so the wait (in the next interval's time) is taken out."""
    rank_1 = RankTotals(batches=2, samples=16, elapsed_s=0.25)
    driver = ClockDriver(tmp_path, "log_every_n_steps=2", "throughput.warmup_steps=0")
    driver.clock.exchange = WaitingExchange(rank_1, driver.time, wait_s=1.0)
    driver.validation(0.125, 0.125, 0.125, 0.125)

    assert driver.recorder.intervals == [("val", 0, 2, 125.0), ("val", 0, 2, 125.0)]
    totals = driver.clock.totals["val"]
    assert (totals.batches, totals.elapsed_s, totals.own_work_s) == (4, 0.5, 1.0)


def test_step_durations_run_batch_end_to_batch_end_and_flag_the_warmup(tmp_path: Path) -> None:
    """`steps.json`'s record: 3 batches of 1, 0.5 and 0.25 s after training starts; the first is warmup."""
    driver = ClockDriver(tmp_path, "log_every_n_steps=10", "throughput.warmup_steps=1")
    driver.clock.train_start()
    driver.train_batches(1.0, 0.5, 0.25)
    seconds, flags = driver.clock.steps.stages["train"].recorded()
    assert seconds.tolist() == [1.0, 0.5, 0.25]
    assert [bool(flag & WARMUP) for flag in flags] == [True, False, False]
