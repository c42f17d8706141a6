"""Time a training stage per log interval without synchronizing the device every step.

On CUDA each interval boundary records one event on the current stream (no host wait). An interval's
duration is read only when the next boundary is reached, from events the GPU passed an interval ago, so
reading them does not stall the queue. On CPU, boundaries are `perf_counter` readings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Union

import torch

Marker = Union[float, "torch.cuda.Event"]
STAGES = ("train", "val")


def _elapsed_s(start: Marker, end: Marker) -> float:
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)  # one clock: both or neither
    end.synchronize()  # recorded an interval ago: the GPU is already past it
    return start.elapsed_time(end) / 1000.0


@dataclass
class GapTimes:
    """Where the host time outside the measured steps went, summed over batches (see `StageClock`)."""

    wait_s: float = 0.0
    """Fetching batches from the dataloader, wherever it ran (between batches, or inside a `dataloader_iter` step)."""
    callbacks_s: float = 0.0
    """Other callbacks' batch hooks between the steps (after ours at a batch's end, before ours at its start), each
    timed by the `LoopTimer`; the profiler's own callbacks are not other callbacks."""
    loop_s: float = 0.0
    """The rest between batches: Lightning's loop, the batch's transfer, logging and, with several ranks, the
    loop's per-batch stop-signal broadcast, in which a rank waits for the others."""
    fetches: int = 0
    """Fetches timed; none means the data wait could not be measured."""

    def add(self, other: GapTimes) -> None:
        self.wait_s += other.wait_s
        self.callbacks_s += other.callbacks_s
        self.loop_s += other.loop_s
        self.fetches += other.fetches


@dataclass
class LeftOut:
    """Training steps after the warmup that are not steady: those `steps.json` flags (a profiling window's, one
    with the profiler's own work, an epoch's first, the first after validation). The steady figures leave their
    batches and time out; the all-in figures count them."""

    batches: int = 0
    samples: int = 0
    items: int = 0
    seconds: float = 0.0
    """Their host time, batch end to batch end, less validation, the epoch start and the profiler's own work in it
    (each taken out apart)."""


@dataclass
class LogInterval:
    """One log interval of a stage: its counts, the global step at its end, and its time segments."""

    step: int
    batches: int
    samples: int
    items: int
    gap: GapTimes
    segments: list[tuple[Marker, Marker]]
    extras: dict[str, float] = field(default_factory=dict)
    """Readings taken at the interval's end, by metric name, logged as they are (memory peaks, see `memory_peaks`)."""
    own_work_s: float = 0.0
    """The profiler's own work (trace export, snapshot dump) inside the segments, to be taken out of the time."""
    epoch_starts: list[tuple[Marker, Marker]] = field(default_factory=list)
    """Training epochs' starts in the interval, outside the segments: each from the epoch's start to its first
    batch (see `StageMeter.pause`)."""
    left_out: LeftOut = field(default_factory=lambda: LeftOut())
    """The interval's steps that are not steady (`StageMeter.leave_out`): in the segments, not in `batches`."""

    def measured_s(self) -> float:
        """Seconds in the segments, the profiler's own work included."""
        return sum(_elapsed_s(start, end) for start, end in self.segments)

    def epoch_start_s(self) -> float:
        """Seconds at epoch starts, on the same clock as the segments."""
        return sum(_elapsed_s(start, end) for start, end in self.epoch_starts)


@dataclass
class RankTotals:
    """What one rank measured over some log intervals of a stage: the unit the ranks exchange.

    `elapsed_s` is the stage's time with the profiler's own work taken out once the ranks have exchanged
    (see `StageClock.end_interval`); before that it still holds `own_work_s`. The `PEAKS` fields keep the largest
    value of the intervals they cover; every other field is a sum.
    """

    batches: float = 0.0
    samples: float = 0.0
    items: float = 0.0
    wait_s: float = 0.0
    elapsed_s: float = 0.0
    own_work_s: float = 0.0
    callbacks_s: float = 0.0
    loop_s: float = 0.0
    fetches: float = 0.0
    sync_steps: float = 0.0
    """Optimizer steps whose gradient all-reduce was timed (see `gradient_sync`)."""
    collective_wait_s: float = 0.0
    """Waits for the last gradient bucket's all-reduce over those steps."""
    flops_per_sample: float = 0.0
    """This rank's FLOPs per sample of its own work (its share under tensor parallelism); 0 when unknown."""
    peak_allocated_mb: float = 0.0
    peak_reserved_mb: float = 0.0
    cpu_rss_mb: float = 0.0
    epoch_start_s: float = 0.0
    """Time from training epochs' starts to their first batches, outside `elapsed_s` (see `StageMeter.pause`)."""
    epoch_starts: float = 0.0
    left_out_batches: float = 0.0
    """Steps after the warmup that are not steady (`LeftOut`): out of `batches` and `elapsed_s`."""
    left_out_samples: float = 0.0
    left_out_items: float = 0.0
    left_out_s: float = 0.0
    all_in_s: float = 0.0
    """Every second of the stage after the warmup, what a clock around it reads: the steady steps, the steps left
    out, the profiler's own work and the epoch starts (validation apart)."""

    def add(self, other: RankTotals) -> None:
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            setattr(self, item.name, max(mine, theirs) if item.name in PEAKS else mine + theirs)

    def to_list(self) -> list[float]:
        return [float(getattr(self, item.name)) for item in fields(self)]  # not astuple: it deep-copies every field

    @classmethod
    def from_list(cls, values: list[float]) -> RankTotals:
        return cls(*values)

    def all_in(self) -> RankTotals:
        """These totals with the steps left out counted in, over every second after the warmup: the all-in
        figures' (`summary/<stage>/..._all_in`)."""
        return RankTotals(
            self.batches + self.left_out_batches,
            self.samples + self.left_out_samples,
            self.items + self.left_out_items,
            elapsed_s=self.all_in_s,
            flops_per_sample=self.flops_per_sample,
        )

    @property
    def step_ms(self) -> float:
        """Mean time per batch, 0 without batches."""
        return self.elapsed_s / self.batches * 1000 if self.batches else 0.0

    def per_batch_ms(self, seconds: float) -> float:
        """`seconds` of these intervals as milliseconds per batch, 0 without batches."""
        return seconds / self.batches * 1000 if self.batches else 0.0

    @classmethod
    def of_interval(cls, interval: LogInterval, seconds: float) -> RankTotals:
        gap, left = interval.gap, interval.left_out
        return cls(
            interval.batches, interval.samples, interval.items, gap.wait_s, seconds, interval.own_work_s,
            gap.callbacks_s, gap.loop_s, gap.fetches,
            epoch_start_s=interval.epoch_start_s(), epoch_starts=len(interval.epoch_starts),
            left_out_batches=left.batches, left_out_samples=left.samples, left_out_items=left.items,
            left_out_s=left.seconds, all_in_s=seconds + interval.epoch_start_s(),
        )  # fmt: skip


PEAKS = ("flops_per_sample", "peak_allocated_mb", "peak_reserved_mb", "cpu_rss_mb")


@dataclass
class LogIntervalReport:
    """What the stage clock hands each listener per log interval: the one message from the clock to the callbacks
    that turn its measurements into metrics (`StageClock.end_interval`)."""

    stage: str
    intervals: list[tuple[LogInterval, float]]
    """The log intervals ready to be read (on CUDA the one before the newest, see `StageMeter.take`), each with its
    seconds, the profiler's own work and the epoch starts taken out."""
    ranks: list[RankTotals] | None
    """`ranks[r]` is rank r's totals over the same intervals; None when the ranks could not exchange."""

    @property
    def step(self) -> int:
        """The global step at the end of the newest interval."""
        return self.intervals[-1][0].step


@dataclass
class ExchangeControl:
    """What a rank tells the others in a training exchange besides its measurements: what every rank must then
    decide alike (a requested window to open, window summaries to exchange). Sent beside `RankTotals` in the same
    gather, never summed."""

    requested_steps: float = 0.0
    """Steps of a profiling window asked for with `anemoi-profiler request` (rank 0 only; see `run.window_triggers`)."""
    requested_ranks: float = 0.0
    """How many ranks it names (rank 0 then broadcasts them); 0: the configured profiled ranks."""
    requested_memory: float = 0.0
    """1: the requested window also takes a CUDA memory snapshot (`request --memory`)."""
    windows_ready: float = 0.0
    """Profiling windows summarised and not yet exchanged (see `cluster.window_exchange`)."""
    windows_summarising: float = 0.0
    """Profiling windows whose summary is still being computed: their exchange waits for them."""

    def to_list(self) -> list[float]:
        return [float(getattr(self, item.name)) for item in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> ExchangeControl:
        return cls(*values)


class StageMeter:
    """Counts and times one stage (train or val); paused while another stage runs.

    `own_work()` reads the profiler's own accumulated work time (see `own_work.OwnWorkClock`); what
    accumulates while the meter runs is taken out of its intervals. `now` is the host clock (tests feed their own
    timestamps); on CUDA the interval boundaries are events instead.
    """

    def __init__(
        self,
        device: torch.device,
        own_work: Callable[[], float] = lambda: 0.0,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._cuda = device.type == "cuda"
        self._own_work = own_work
        self._now = now
        self._own_work_at_open = 0.0
        self._opened_at = 0.0
        self._own_work_s = 0.0
        self._run_s = 0.0
        self._run_own_work_s = 0.0
        self._run_own_work_at_open = 0.0
        self._open: Marker | None = None
        self.running = False
        """Whether an interval is open (between `start` and `stop`)."""
        self._segments: list[tuple[Marker, Marker]] = []
        self.batches = 0
        self._samples = 0
        self._items = 0
        self.gap = GapTimes()
        """The current interval's gap times, which `BatchGaps.batch_ended` adds each batch's to."""
        self._pending: list[LogInterval] = []
        self.first_started_at: float | None = None
        """`perf_counter` when the stage's first measured interval began (after the warmup)."""
        self.last_stopped_at: float | None = None
        """`perf_counter` when it last stopped (for training: at a validation or the end of training)."""
        self._paused_at: Marker | None = None
        self._epoch_starts: list[tuple[Marker, Marker]] = []
        self.left_out = LeftOut()
        """The current interval's steps left out of the steady figures (`leave_out`)."""

    def _mark(self) -> Marker:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._now()

    def start(self) -> None:
        if self._open is None:
            self._open = self._mark()
            self.running = True
            self._own_work_at_open = self._run_own_work_at_open = self._own_work()
            self._opened_at = self._now()
            if self.first_started_at is None:
                self.first_started_at = self._opened_at

    def stop(self) -> None:
        if self._open is not None:
            self._run_s, self._run_own_work_s = self.reading()
            self._segments.append((self._open, self._mark()))
            self._open = None
            self.running = False
            self.last_stopped_at = self._now()
            self._own_work_s += self._own_work() - self._own_work_at_open

    def leave_out_since(self, host_time: float) -> None:
        """Take the open interval's time since `host_time` (the last batch's end) out, as the profiler's own work
        is: the hooks and checkpoint after a stage's last batch are no batch's."""
        if self._open is not None:
            self._own_work_s += max(0.0, self._now() - max(host_time, self._opened_at))

    def pause(self) -> None:
        """Stop timing at a training epoch's start, until `resume` at its first batch.

        Each epoch with non-persistent DataLoader workers starts them again (and they open the dataset again)
        before its first batch: that time is the interval's `epoch_starts`, not a step's.
        """
        if self._open is not None:
            self.stop()
            self._paused_at = self._segments[-1][1]

    def resume(self) -> None:
        if self._paused_at is not None:
            self.start()
            assert self._open is not None
            self._epoch_starts.append((self._paused_at, self._open))
            self._paused_at = None

    def count(self, samples: int, items: int) -> None:
        self.batches += 1
        self._samples += samples
        self._items += items

    def reading(self) -> tuple[float, float]:
        """(host seconds this meter has run, the profiler's own work in them), both summed since it was made: two
        readings bound the measured time between them, whatever stops and pauses lay in between."""
        if self._open is None:
            return self._run_s, self._run_own_work_s
        return (
            self._run_s + self._now() - self._opened_at,
            self._run_own_work_s + self._own_work() - self._run_own_work_at_open,
        )

    def leave_out(self, samples: int, items: int, since: tuple[float, float]) -> None:
        """The step that just ended is not steady: its batch is not counted and its time, the measured time since
        `since` (the `reading()` at the previous batch's end) less the own work in it (taken out apart), is left
        out of the interval's. That is all of the step's time but validation and the epoch start: epoch-end hooks
        and a checkpoint saved at the epoch's end go with the next epoch's first step. On CUDA a host duration, as
        the own work is."""
        left = self.left_out
        left.batches += 1
        left.samples += samples
        left.items += items
        if self._open is None:
            return
        run_s, own_work_s = self.reading()
        left.seconds += max(0.0, (run_s - since[0]) - (own_work_s - since[1]))

    @property
    def counted(self) -> int:
        """Batches of the current interval, steady or left out: an interval ends after `log_every_n_steps` of them
        on every rank alike."""
        return self.batches + self.left_out.batches

    def end_interval(self, step: int, extras: dict[str, float] | None = None) -> None:
        """Close the current interval (if it counted any batch) and keep the clock running."""
        if self._open is not None:
            marker = self._mark()
            self._segments.append((self._open, marker))
            self._open = marker
            now = self._own_work()
            self._own_work_s += now - self._own_work_at_open
            self._own_work_at_open = now
        if self.batches or self.left_out.batches:
            interval = LogInterval(
                step, self.batches, self._samples, self._items, self.gap, self._segments, extras or {}
            )
            interval.own_work_s = self._own_work_s
            interval.epoch_starts, self._epoch_starts = self._epoch_starts, []
            interval.left_out = self.left_out
            self._pending.append(interval)
        self.left_out = LeftOut()
        self._own_work_s = 0.0
        self._segments = []
        self.batches = self._samples = self._items = 0
        self.gap = GapTimes()

    def take(self, keep_newest: bool) -> list[LogInterval]:
        """Log intervals ready to be read; on CUDA the newest is kept back until the next boundary."""
        keep = 1 if (keep_newest and self._cuda) else 0
        ready, self._pending = (
            self._pending[: len(self._pending) - keep],
            self._pending[len(self._pending) - keep :],
        )
        return ready
