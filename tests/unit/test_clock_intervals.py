"""The arithmetic of `StageMeter`, `LogInterval` and `RankTotals` on timestamps the test sets by hand: no Trainer,
no fit.

Times are multiples of 1/8 s, so every sum below is exact in binary floating point.
"""

from __future__ import annotations

import torch

from anemoi_profiler.clock import RankTotals, StageMeter
from tests.helpers.clock_driver import ManualTime

CPU = torch.device("cpu")


def run_batches(meter: StageMeter, time: ManualTime, seconds: list[float], samples: int = 8) -> None:
    for duration in seconds:
        time.advance(duration)
        meter.count(samples, 0)


def intervals_of(meter: StageMeter) -> list[tuple[int, int, int, float]]:
    """(step, batches, samples, seconds) of each interval ready to read."""
    return [
        (interval.step, interval.batches, interval.samples, interval.measured_s())
        for interval in meter.take(keep_newest=False)
    ]


def test_each_interval_holds_the_time_between_its_boundaries() -> None:
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.start()  # t = 100
    run_batches(meter, time, [0.25] * 4)
    meter.end_interval(step=4)  # t = 101: 4 batches in 1 s
    run_batches(meter, time, [0.5, 0.5])
    meter.end_interval(step=6)  # t = 102: 2 batches in 1 s

    first, second = meter.take(keep_newest=False)
    assert [
        (interval.step, interval.batches, interval.samples, interval.measured_s()) for interval in (first, second)
    ] == [
        (4, 4, 32, 1.0),
        (6, 2, 16, 1.0),
    ]
    # Step time per interval: 1 s / 4 batches = 250 ms, 1 s / 2 batches = 500 ms.
    assert RankTotals.of_interval(first, first.measured_s()).step_ms == 250.0
    assert RankTotals.of_interval(second, second.measured_s()).step_ms == 500.0
    assert (meter.first_started_at, meter.last_stopped_at) == (100.0, None)


def test_time_while_stopped_is_in_no_interval() -> None:
    """Stopped for 10 s (a validation run): the interval holds 1 s + 0.5 s over 4 batches = 375 ms a batch."""
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.start()
    run_batches(meter, time, [0.5, 0.5])
    meter.stop()  # t = 101
    time.advance(10.0)
    meter.start()  # t = 111
    run_batches(meter, time, [0.25, 0.25])
    meter.end_interval(step=4)

    (interval,) = meter.take(keep_newest=False)
    assert (interval.batches, interval.measured_s(), len(interval.segments)) == (4, 1.5, 2)
    assert RankTotals.of_interval(interval, interval.measured_s()).step_ms == 375.0
    assert meter.last_stopped_at == 101.0


def test_an_interval_without_a_batch_makes_no_interval_and_its_time_is_dropped() -> None:
    """3 s pass with no batch counted: no interval, and the next interval holds only its own 0.5 s."""
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.start()
    time.advance(3.0)
    meter.end_interval(step=0)
    assert meter.take(keep_newest=False) == []
    run_batches(meter, time, [0.5])
    meter.end_interval(step=1)
    assert intervals_of(meter) == [(1, 1, 8, 0.5)]
    assert RankTotals().step_ms == 0.0  # no batch: no step time, no division by zero
    assert RankTotals().per_batch_ms(1.0) == 0.0


def test_a_single_step_is_a_interval_of_its_own() -> None:
    """One batch of 0.125 s, the meter stopped before the interval: 125 ms."""
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.start()
    run_batches(meter, time, [0.125], samples=1)
    meter.stop()
    time.advance(1.0)  # after the stop: not the step's
    meter.end_interval(step=1)
    (interval,) = meter.take(keep_newest=False)
    assert (interval.batches, interval.samples, interval.measured_s()) == (1, 1, 0.125)
    assert RankTotals.of_interval(interval, interval.measured_s()).step_ms == 125.0


def test_own_work_while_running_goes_with_the_interval_and_none_while_stopped() -> None:
    """0.5 s of trace export inside the interval is the interval's own work (taken out later: 1.5 - 0.5 = 1 s over
    4 batches, 250 ms); 2 s of it while the meter was stopped is not."""
    time = ManualTime()
    own_work = [0.0]
    meter = StageMeter(CPU, own_work=lambda: own_work[0], now=time)
    meter.start()
    run_batches(meter, time, [0.25, 0.25])
    time.advance(0.5)
    own_work[0] += 0.5  # a trace export between two batches
    run_batches(meter, time, [0.25])
    meter.stop()
    own_work[0] += 2.0  # during validation
    meter.start()
    run_batches(meter, time, [0.25])
    meter.end_interval(step=4)

    (interval,) = meter.take(keep_newest=False)
    assert (interval.measured_s(), interval.own_work_s) == (1.5, 0.5)
    totals = RankTotals.of_interval(interval, interval.measured_s() - interval.own_work_s)
    assert (totals.elapsed_s, totals.own_work_s, totals.step_ms) == (1.0, 0.5, 250.0)


def test_a_paused_meter_keeps_the_epoch_start_out_of_its_interval() -> None:
    """1 s of batch, a 5 s epoch start (paused twice, resumed twice: the second of each changes nothing), 2 s of
    batch: the interval holds 3 s and one epoch start of 5 s."""
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.resume()  # nothing paused: nothing happens
    meter.start()
    run_batches(meter, time, [1.0], samples=4)
    meter.pause()  # an epoch starts
    time.advance(5.0)
    meter.pause()  # a second pause while paused changes nothing
    meter.resume()  # its first batch
    meter.resume()
    run_batches(meter, time, [2.0], samples=4)
    meter.end_interval(step=2)
    (interval,) = meter.take(keep_newest=False)

    assert (interval.measured_s(), interval.epoch_start_s(), len(interval.epoch_starts)) == (3.0, 5.0, 1)
    totals = RankTotals.of_interval(interval, interval.measured_s())
    assert (totals.elapsed_s, totals.epoch_start_s, totals.epoch_starts, totals.batches) == (3.0, 5.0, 1.0, 2.0)


def test_two_epoch_starts_in_one_interval_add_up() -> None:
    """Paused twice in one interval, for 1.5 s and 0.5 s: 2 s at 2 epoch starts; 4 batches of 0.25 s."""
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.start()
    for pause in (1.5, 0.5):
        run_batches(meter, time, [0.25])
        meter.pause()
        time.advance(pause)
        meter.resume()
        run_batches(meter, time, [0.25])
    meter.end_interval(step=4)
    (interval,) = meter.take(keep_newest=False)
    assert (interval.measured_s(), interval.epoch_start_s(), len(interval.epoch_starts)) == (1.0, 2.0, 2)


def test_an_epoch_start_without_a_batch_yet_waits_for_the_next_interval() -> None:
    time = ManualTime()
    meter = StageMeter(CPU, now=time)
    meter.start()
    meter.pause()
    time.advance(1.0)
    meter.resume()
    meter.end_interval(step=0)  # no batch counted: no interval, the epoch start stays
    run_batches(meter, time, [1.0], samples=1)
    meter.end_interval(step=1)
    (interval,) = meter.take(keep_newest=False)
    assert (interval.epoch_start_s(), interval.batches) == (1.0, 1)


def test_rank_totals_sum_their_counts_and_keep_the_largest_peak() -> None:
    """4 batches in 1 s plus 2 in 0.5 s: 6 in 1.5 s, 250 ms a batch; peaks 100 and 300 MB: 300 MB."""
    totals = RankTotals(batches=4, elapsed_s=1.0, wait_s=0.25, peak_allocated_mb=100.0)
    totals.add(RankTotals(batches=2, elapsed_s=0.5, wait_s=0.125, peak_allocated_mb=300.0))
    assert (totals.batches, totals.elapsed_s, totals.peak_allocated_mb) == (6, 1.5, 300.0)
    assert totals.step_ms == 250.0
    assert totals.per_batch_ms(totals.wait_s) == 62.5  # 0.375 s of data wait over 6 batches
    assert RankTotals.from_list(totals.to_list()) == totals
