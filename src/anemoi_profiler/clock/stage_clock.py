"""One clock per session for the training and validation stages: what is measured per batch is measured here.

The data flow: Lightning calls the clock callback's hooks (`clock.clock_callback`, the one callback that defines
the batch hooks, which the session puts into the trainer); it calls the clock, which measures; at each log
interval's end the clock exchanges this rank's totals with the other ranks and hands every listener one
`LogIntervalReport`; the listeners (the throughput and step-timing callbacks) turn it into metrics. However many
listen, the per-batch cost is the clock's: a few `perf_counter` calls and additions, and a batch-size lookup where
samples are counted; no device sync, no I/O. Logging and the cross-rank exchange happen only at log intervals.

Who measures what, all owned by the clock:

- the step: a `StageMeter` per stage (`intervals`), intervals timed with CUDA events on a GPU, steady state only
  (after `throughput.warmup_steps` training batches, never the sanity check), validation time out of training's;
- the data wait, other callbacks' hooks and Lightning's loop between the steps: `BatchGaps`, with the fetches
  and other callbacks' hooks timed by the `LoopTimer` that stands in for the trainer's profiler (`batch_gaps`,
  `loop_timer`);
- the collective wait: the `GradientSyncTimer` (`distributed.gradient_sync`), read at each training interval's end;
- the epoch starts: `StageMeter.pause` and `resume`, from an epoch's start to its first batch;
- the profiler's own work (trace export, snapshot dump), taken out of every figure: `OwnWorkClock` (`own_work`);
- each step's duration for `steps.json`: `StepRecord` (`step_record`);
- and what a listener asks for when the session starts: samples and items per batch (`BatchCounter`), the FLOPs
  of the first step (`FirstStepFlops`), memory peaks per interval (`MemoryPeaks`).

Measurements (`RankTotals`) and control messages (`ExchangeControl`, which the training exchange also carries for
triggers and window summaries) are separate types, sent in one gather.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from anemoi_profiler.clock.batch_count import BatchCounter
from anemoi_profiler.clock.batch_gaps import BatchGaps
from anemoi_profiler.clock.intervals import (
    STAGES,
    ExchangeControl,
    LogInterval,
    LogIntervalReport,
    RankTotals,
    StageMeter,
)
from anemoi_profiler.clock.memory_peaks import PEAK_FIELDS, MemoryPeaks
from anemoi_profiler.clock.own_work import OwnWorkClock
from anemoi_profiler.clock.step_flops import FirstStepFlops
from anemoi_profiler.clock.step_record import StepRecord
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.distributed.gradient_sync import GradientSyncTimer
from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.steps_file import EPOCH_START, NOT_STEADY
from anemoi_profiler.trainer import trainer_info
from anemoi_profiler.trainer.lightning_private import TRAIN_FETCH, missing
from anemoi_profiler.trainer.trainer_info import TrainerLike

log = get_logger(__name__)


class IntervalListener(Protocol):
    def on_log_interval(self, report: LogIntervalReport) -> None:
        """Turn one log interval's measurements into metrics (rank 0 logs them)."""


class TrainExchangeHook(Protocol):
    def outgoing(self, control: ExchangeControl) -> None: ...

    def received(self, step: int, ranks: list[RankTotals], controls: list[ExchangeControl]) -> None: ...


class StageClock:
    """Made by the session when it starts; `exchanges_allowed()` turns False once a rank failed.

    The clock callback calls the hooks below and catches their errors: an error stops the clock, not the training.
    """

    def __init__(
        self,
        config: ProfilerConfig,
        device: torch.device,
        exchange: RankExchange,
        own_work: OwnWorkClock,
        gradient_sync: GradientSyncTimer,
        exchanges_allowed: Callable[[], bool],
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`now` is the host clock of every timestamp the clock takes (tests feed their own)."""
        self.config = config
        self._now = now
        self.exchange = exchange
        self.gradient_sync = gradient_sync
        self._exchanges_allowed = exchanges_allowed
        self._own_work = own_work
        self.meters = {stage: StageMeter(device, lambda: own_work.total_s, now) for stage in STAGES}
        self.totals = {stage: RankTotals() for stage in STAGES}
        # Every rank's totals over the intervals that all ranks exchanged: what is global after a rank failed.
        self.exchanged: dict[str, list[RankTotals]] = {stage: [] for stage in STAGES}
        self.listeners: list[IntervalListener] = []
        self._train = self.meters["train"]  # read every batch
        self.train_batches_seen = 0
        self.last_train_batch_end = 0.0
        self._train_reading_at_batch_end = (0.0, 0.0)
        """The training meter's `reading()` at the last batch's end: where a step left out begins."""
        self.left_out_steps = 0
        """Training steps after the warmup left out of the steady figures so far (`StageMeter.leave_out`): a
        sampler that sees it change knows that its interval held one."""
        self._epoch_starting = False
        self.gaps = BatchGaps(own_work, now)
        self.steps = StepRecord(own_work, config.throughput.warmup_steps)
        """Each step's duration, for `compare --fail-if-slower` (see `step_record`)."""
        self.train_exchanges: list[TrainExchangeHook] = []
        """Add to each training exchange and read what it gathered: triggers, the window summaries' exchange."""
        # What listeners ask the clock to measure when the session starts (the throughput and step timing
        # callbacks); without them a batch counts as a batch, with no samples, items, FLOPs or memory.
        self.counter: BatchCounter | None = None
        """Counts samples and items in each batch."""
        self.flops: FirstStepFlops | None = None
        """Counts the first training step's FLOPs."""
        self.flops_per_sample = 0.0
        """This rank's FLOPs per sample (configured, or counted on the first step); 0 when unknown."""
        self.memory: MemoryPeaks | None = None
        """Reads memory peaks at each training interval's end."""

    def join(self, listener: IntervalListener) -> None:
        """Hand `listener` the log-interval reports (`ProfilerSession.join_clock`)."""
        self.listeners.append(listener)

    def leave(self, listener: IntervalListener) -> None:
        """Stop handing `listener` reports (it failed); the clock goes on for the others."""
        self.listeners = [other for other in self.listeners if other is not listener]

    def close(self) -> None:
        """At the session's end: leave no FLOP counter (and its eager mode) on after a failed first step."""
        if self.flops is not None:
            self.flops.close()

    # ---- training ----
    def train_start(self) -> None:
        self.steps.stage_started("train", self._now())
        if self.config.throughput.warmup_steps == 0:
            self.meters["train"].start()

    def train_epoch_start(self) -> None:
        """An epoch starts: until its first batch (DataLoader workers starting again, a dataset opening again),
        training time pauses; the pause is the epoch start's own figure, not a step's."""
        self.steps.mark("train", EPOCH_START)
        if self._train.running:
            self._train.pause()
            self._epoch_starting = True

    def train_batch_start(self) -> None:
        if self.train_batches_seen == 0 and self.flops is not None:
            self.flops.step_started(self.gaps.loop_timer)
        if self._epoch_starting:
            self._epoch_starting = False
            self._train.resume()
            self.gaps.reset()  # the epoch start's fetches are no batch's
        self.gaps.batch_started()

    def train_batch_end(self, trainer: TrainerLike, batch: Any) -> None:
        step_started = self._train_reading_at_batch_end
        self.last_train_batch_end = now = self._now()
        self._train_reading_at_batch_end = self._train.reading()
        flags = self.steps.train_step_ended(now)
        self.train_batches_seen += 1
        if self.train_batches_seen == 1 and self.flops is not None:
            samples = self.counter.count(batch)[0] if self.counter is not None else 0
            counted = self.flops.step_ended(self.gaps.loop_timer, samples)
            self.flops_per_sample = counted or self.flops_per_sample
        meter = self._train
        if meter.running:
            counter = self.counter
            samples, items = counter.count(batch) if counter is not None else (0, 0)
            if flags & NOT_STEADY:  # out of the steady figures, in the all-in ones
                self.gaps.batch_ended("train", None, sample_next_gap=False)
                meter.leave_out(samples, items, step_started)
                self.left_out_steps += 1
            else:
                self.gaps.batch_ended("train", meter.gap, sample_next_gap=meter.batches == 0)
                meter.count(samples, items)
            if meter.counted >= self.config.log_every_n_steps:
                self.end_interval(trainer, "train")
        else:
            self.gaps.batch_ended("train", None, sample_next_gap=False)
            if self.train_batches_seen == self.config.throughput.warmup_steps:
                meter.start()
                self.gradient_sync.take()  # the warmup's all-reduces are not steady state

    def train_end(self, trainer: TrainerLike) -> None:
        # What ran after the last batch (epoch-end hooks, the last checkpoint) is no batch's: the steady figures
        # end where the last batch did, as a clock around the batches reads.
        self.meters["train"].leave_out_since(self.last_train_batch_end)
        self.end_interval(trainer, "train", final=True)
        self.meters["train"].stop()
        train = self.totals["train"]
        if self.gaps.loop_timer is not None and not train.fetches and train.batches > train.epoch_starts:
            # Every batch but an epoch's first has its fetch timed, unless Lightning renamed the action.
            missing(f"profiler action {TRAIN_FETCH!r}", "the data wait is not assessed")

    # ---- validation (never the sanity check) ----
    def validation_start(self, trainer: TrainerLike) -> None:
        if not trainer.sanity_checking:
            self.meters["train"].stop()
            self.steps.stage_started("val", self._now())
        self.gaps.reset()

    def validation_batch_start(self, trainer: TrainerLike) -> None:
        self.gaps.batch_started()
        if not trainer.sanity_checking:
            meter = self.meters["val"]
            if not meter.running:  # the first batch's fetch ran before validation's clock started: no step's
                self.gaps.drop_fetches("val")
            meter.start()

    def validation_batch_end(self, trainer: TrainerLike, batch: Any) -> None:
        meter = self.meters["val"]
        sanity_checking = trainer.sanity_checking
        self.gaps.batch_ended("val", None if sanity_checking else meter.gap, sample_next_gap=False)
        if sanity_checking:
            return
        self.steps.val_step_ended(self._now())
        counter = self.counter
        samples, items = counter.count(batch) if counter is not None else (0, 0)
        meter.count(samples, items)
        if meter.batches >= self.config.log_every_n_steps:
            self.end_interval(trainer, "val")

    def validation_end(self, trainer: TrainerLike) -> None:
        if trainer.sanity_checking:
            return
        self.end_interval(trainer, "val", final=True)
        self.meters["val"].stop()
        self.steps.stage_started("train", self._now())
        if self.train_batches_seen >= self.config.throughput.warmup_steps and trainer.state.fn == "fit":
            self.meters["train"].start()
        self.gaps.reset()

    # ---- log intervals ----
    def end_interval(self, trainer: TrainerLike, stage: str, final: bool = False) -> None:
        """Close the interval, exchange it across ranks and hand every listener its report."""
        meter = self.meters[stage]
        readings = self.memory.read() if self.memory is not None and stage == "train" else {}
        meter.end_interval(trainer_info.global_step(trainer), readings)
        taken = [(interval, interval.measured_s()) for interval in meter.take(keep_newest=not final)]
        local = RankTotals(flops_per_sample=self.flops_per_sample)
        for interval, seconds in taken:
            local.add(RankTotals.of_interval(interval, seconds))
        if stage == "train":
            local.collective_wait_s, sync_steps = self.gradient_sync.take()
            local.sync_steps = float(sync_steps)
        for field, key in PEAK_FIELDS.items():
            if key in readings:
                setattr(local, field, readings[key])
        control = ExchangeControl()
        for hook in self.train_exchanges if stage == "train" else ():
            hook.outgoing(control)
        # Every rank reaches this point at the same batch count, so the collective lines up.
        if stage == "val" and self.exchange.world_size > 1:
            with self._own_work.measure():  # validation's ranks meet only here: a wait the profiler adds
                gathered = self._gather(local, control)
        else:
            gathered = self._gather(local, control)
        ranks, controls = gathered if gathered is not None else (None, None)
        if ranks and stage == "train":
            # The gradient all-reduce makes the ranks wait for each other every step: the slowest rank's own work
            # is in every rank's time. So is the longest epoch start, every rank's epoch start: the others wait for
            # it in the epoch's first step, which every rank leaves out (its time is in `left_out_s`).
            own_work_s = max(rank.own_work_s for rank in ranks)
            epoch_start_s = max(rank.epoch_start_s for rank in ranks)
            intervals = _without_own_work(taken, own_work_s)
            for totals in (local, *ranks):
                totals.elapsed_s -= own_work_s + totals.left_out_s
                totals.epoch_start_s = epoch_start_s
        else:
            # Validation steps have no collective, so no rank waits for another's work (nor does a rank alone):
            # each rank's own work is its own.
            for totals in (local, *(ranks or ())):
                totals.elapsed_s -= totals.own_work_s + totals.left_out_s
            intervals = _without_own_work(taken, local.own_work_s)
        self.totals[stage].add(local)
        if ranks:
            sums = self.exchanged[stage] or [RankTotals() for _ in ranks]
            for rank_sums, rank in zip(sums, ranks, strict=True):
                rank_sums.add(rank)
            self.exchanged[stage] = sums
        if ranks and stage == "train":
            for hook in self.train_exchanges:
                hook.received(trainer_info.global_step(trainer), ranks, controls or [])
        if intervals:
            self._report(LogIntervalReport(stage, intervals, ranks))

    def _report(self, report: LogIntervalReport) -> None:
        """Hand `report` to every listener. Their work is rank 0's alone: a listener that fails is dropped, so that
        its error cannot stop this rank's exchanges (the others would wait for it for `distributed.timeout_s`)."""
        for listener in list(self.listeners):
            try:
                listener.on_log_interval(report)
            except Exception as error:
                self.leave(listener)
                log.warning(
                    "%s stopped logging interval metrics after an error: %s: %s (training continues)",
                    type(listener).__name__,
                    type(error).__name__,
                    error,
                )

    def gathered_totals(self, stage: str) -> list[RankTotals]:
        """Every rank's totals for the stage at the end.

        Once the ranks can no longer exchange (one failed), the totals of the intervals they all exchanged
        before: this rank's own totals alone would pass for the sum over ranks.
        """
        local = self.totals[stage]
        if self.exchange.world_size == 1:
            return [local]
        gathered = self._gather(local, ExchangeControl())
        return gathered[0] if gathered is not None and gathered[0] else self.exchanged[stage]

    def _gather(
        self, local: RankTotals, control: ExchangeControl
    ) -> tuple[list[RankTotals], list[ExchangeControl]] | None:
        """Every rank's measurements and control messages, in one collective."""
        if not self._exchanges_allowed():
            return None
        gathered = self.exchange.gather(local.to_list() + control.to_list())
        if gathered is None:
            return None
        size = len(local.to_list())
        return (
            [RankTotals.from_list(values[:size]) for values in gathered],
            [ExchangeControl.from_list(values[size:]) for values in gathered],
        )


def _without_own_work(taken: list[tuple[LogInterval, float]], own_work_s: float) -> list[tuple[LogInterval, float]]:
    """Each interval's seconds less its share of `own_work_s` and its steps left out, dropping intervals that took
    no measurable time or had no steady step.

    `own_work_s` is at least the intervals' own work, taken out interval by interval; in training, what other
    ranks' own work added (all ranks wait for the slowest) is spread over the intervals by their length.
    """
    own = sum(interval.own_work_s for interval, _ in taken)
    measured = sum(seconds for _, seconds in taken)
    waited = own_work_s - own
    intervals = []
    for interval, seconds in taken:
        share = waited * seconds / measured if measured > 0 else 0.0
        remaining = seconds - interval.own_work_s - interval.left_out.seconds - share
        if remaining > 0 and interval.batches:  # an interval of steps left out only is no steady figure's
            intervals.append((interval, remaining))
    return intervals
