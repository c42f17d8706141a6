"""One clock per session for the training and validation stages, shared by every interval-metrics callback.

Throughput and step timing read the same intervals. Measuring them once per batch, and exchanging them
across ranks once per log interval, keeps the per-batch cost of the profiler the same however many of
them listen: one callback drives the clock from Lightning's hooks (`callbacks.clock_callback`), the
listeners only receive log intervals.

What a listener gets: per log interval, `LogInterval`s with batches, samples, items, elapsed time and where the time
between the steps went (data fetch, other callbacks, Lightning's loop: see `batch_gaps`), steady-state only
(after `throughput.warmup_steps` training batches, never the sanity check), with validation time and the
profiler's own work (trace export, snapshot dump) taken out of training intervals; and every rank's
`RankTotals` over the same intervals. The hot path per batch is a few `perf_counter` calls and additions and a
batch-size lookup; logging and the cross-rank exchange happen only at log intervals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ...config import ProfilerConfig
from ...reports.step_series import EPOCH_START
from .. import trainer_info
from ..distributed import RankExchange
from ..gradient_sync import GradientSyncTimer
from ..lightning_private import TRAIN_FETCH, missing
from ..trainer_info import TrainerLike
from .batch_gaps import BatchGaps
from .intervals import STAGES, ExchangeControl, LogInterval, RankTotals, StageMeter
from .own_work import OwnWorkClock
from .step_record import StepRecord


class Listener(Protocol):
    def count_batch(self, stage: str, batch: Any) -> tuple[int, int]: ...

    def interval_extras(self, stage: str) -> dict[str, float]: ...

    def rank_values(self, stage: str) -> dict[str, float]: ...

    def first_train_batch(self, batch: Any, ended: bool) -> None: ...

    def report_log_intervals(
        self, trainer: Any, stage: str, intervals: list[tuple[LogInterval, float]], ranks: list[RankTotals] | None
    ) -> None: ...


class TrainExchangeHook(Protocol):
    def outgoing(self, control: ExchangeControl) -> None: ...

    def received(self, step: int, ranks: list[RankTotals], controls: list[ExchangeControl]) -> None: ...


class StageClock:
    """Made by the session when it starts; `exchanges_allowed()` turns False once a rank failed."""

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
        self.meters = {stage: StageMeter(device, lambda: own_work.total_s, now) for stage in STAGES}
        self.totals = {stage: RankTotals() for stage in STAGES}
        # Every rank's totals over the intervals that all ranks exchanged: what is global after a rank failed.
        self.exchanged: dict[str, list[RankTotals]] = {stage: [] for stage in STAGES}
        self.listeners: list[Listener] = []
        self._counters: list[Callable[[str, Any], tuple[int, int]]] = []
        self._extras: list[Callable[[str], dict[str, float]]] = []
        self._count: Callable[[str, Any], tuple[int, int]] = self._count_all
        self._train = self.meters["train"]  # read every batch
        self.train_batches_seen = 0
        self.last_train_batch_end = 0.0
        self._epoch_starting = False
        self.gaps = BatchGaps(own_work, now)
        self.steps = StepRecord(own_work, config.throughput.warmup_steps)
        """Each step's duration, for `compare --fail-if-slower` (see `step_record`)."""
        self.hook_failed: Callable[[str, Exception], None] = _raise
        """Set by the clock callback: what an error in a batch hook does (by default, it is raised)."""
        self.train_exchanges: list[TrainExchangeHook] = []
        """Add to each training exchange and read what it gathered: triggers, the window summaries' exchange."""

    def join(self, listener: Listener, counts: bool, has_extras: bool) -> bool:
        """Add a listener; True when it is the first, which then puts the clock callback into the trainer."""
        self.listeners.append(listener)
        if counts:
            self._counters.append(listener.count_batch)
        if has_extras:
            self._extras.append(listener.interval_extras)
        self._count = self._counters[0] if len(self._counters) == 1 else self._count_all
        return len(self.listeners) == 1

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

    # The four batch hooks, called by the clock callback's hooks of the same names (`callbacks.clock_callback`).
    # An error goes to `hook_failed`, which stops the clock; training goes on.
    def on_train_batch_start(self, trainer: TrainerLike, pl_module: Any, batch: Any, batch_idx: int) -> None:
        try:
            if self.train_batches_seen == 0:
                for listener in self.listeners:
                    listener.first_train_batch(batch, ended=False)
            if self._epoch_starting:
                self._epoch_starting = False
                self._train.resume()
                self.gaps.reset()  # the epoch start's fetches are no batch's
            self.gaps.batch_started()
        except Exception as error:
            self.hook_failed("on_train_batch_start", error)

    def on_train_batch_end(
        self, trainer: TrainerLike, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            self.last_train_batch_end = self._now()
            self.steps.train_step_ended(self.last_train_batch_end)
            self.train_batches_seen += 1
            if self.train_batches_seen == 1:
                for listener in self.listeners:
                    listener.first_train_batch(batch, ended=True)
            meter = self._train
            if meter.running:
                self.gaps.batch_ended("train", meter.gap, sample_next_gap=meter.batches == 0)
                samples, items = self._count("train", batch)
                meter.count(samples, items)
                if meter.batches >= self.config.log_every_n_steps:
                    self.end_interval(trainer, "train")
            else:
                self.gaps.batch_ended("train", None, sample_next_gap=False)
                if self.train_batches_seen == self.config.throughput.warmup_steps:
                    meter.start()
                    self.gradient_sync.take()  # the warmup's all-reduces are not steady state
        except Exception as error:
            self.hook_failed("on_train_batch_end", error)

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

    def on_validation_batch_start(
        self, trainer: TrainerLike, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        try:
            self.gaps.batch_started()
            if not trainer.sanity_checking:
                meter = self.meters["val"]
                if not meter.running:  # the first batch's fetch ran before validation's clock started: no step's
                    self.gaps.drop_fetches("val")
                meter.start()
        except Exception as error:
            self.hook_failed("on_validation_batch_start", error)

    def on_validation_batch_end(
        self, trainer: TrainerLike, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        try:
            meter = self.meters["val"]
            sanity_checking = trainer.sanity_checking
            self.gaps.batch_ended("val", None if sanity_checking else meter.gap, sample_next_gap=False)
            if sanity_checking:
                return
            self.steps.val_step_ended(self._now())
            samples, items = self._count("val", batch)
            meter.count(samples, items)
            if meter.batches >= self.config.log_every_n_steps:
                self.end_interval(trainer, "val")
        except Exception as error:
            self.hook_failed("on_validation_batch_end", error)

    def validation_end(self, trainer: TrainerLike) -> None:
        if trainer.sanity_checking:
            return
        self.end_interval(trainer, "val", final=True)
        self.meters["val"].stop()
        self.steps.stage_started("train", self._now())
        if self.train_batches_seen >= self.config.throughput.warmup_steps and trainer.state.fn == "fit":
            self.meters["train"].start()
        self.gaps.reset()

    # ---- intervals ----
    def _count_all(self, stage: str, batch: Any) -> tuple[int, int]:
        """(samples, items) of a batch, the largest any listener counted (0, 0 without a counting one)."""
        samples = items = 0
        for count in self._counters:
            counted = count(stage, batch)
            samples, items = max(samples, counted[0]), max(items, counted[1])
        return samples, items

    def end_interval(self, trainer: TrainerLike, stage: str, final: bool = False) -> None:
        """Close the interval, exchange it across ranks and hand it to every listener."""
        meter = self.meters[stage]
        extras: dict[str, float] = {}
        for interval_extras in self._extras:
            extras.update(interval_extras(stage))
        meter.end_interval(trainer_info.global_step(trainer), extras)
        taken = [(interval, interval.measured_s()) for interval in meter.take(keep_newest=not final)]
        local = RankTotals()
        for interval, seconds in taken:
            local.add(RankTotals.of_interval(interval, seconds))
        if stage == "train":
            local.collective_wait_s, sync_steps = self.gradient_sync.take()
            local.sync_steps = float(sync_steps)
        for listener in self.listeners:
            for name, value in listener.rank_values(stage).items():
                setattr(local, name, value)
        control = ExchangeControl()
        for hook in self.train_exchanges if stage == "train" else ():
            hook.outgoing(control)
        # Every rank reaches this point at the same batch count, so the collective lines up.
        gathered = self._gather(local, control)
        ranks, controls = gathered if gathered is not None else (None, None)
        # The ranks wait for each other every step: the slowest rank's own work is in every rank's time, and so is
        # the longest epoch start (the others wait for it in the epoch's first step): every rank's epoch start.
        own_work_s = max(rank.own_work_s for rank in ranks) if ranks else local.own_work_s
        epoch_start_s = max(rank.epoch_start_s for rank in ranks) if ranks else local.epoch_start_s
        intervals = _without_own_work(taken, own_work_s + epoch_start_s - local.epoch_start_s)
        for totals in (local, *(ranks or ())):
            totals.elapsed_s -= own_work_s + epoch_start_s - totals.epoch_start_s
            totals.epoch_start_s = epoch_start_s
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
            for listener in self.listeners:
                listener.report_log_intervals(trainer, stage, intervals, ranks)

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


def _raise(hook: str, error: Exception) -> None:
    raise error


def _without_own_work(taken: list[tuple[LogInterval, float]], own_work_s: float) -> list[tuple[LogInterval, float]]:
    """Each interval's seconds less its share of `own_work_s`, dropping intervals that took no measurable time.

    With one rank `own_work_s` is the intervals' own work, taken out interval by interval; what other ranks' work
    and longer epoch starts added (all ranks wait for the slowest) is spread over the intervals by their length.
    """
    own = sum(interval.own_work_s for interval, _ in taken)
    measured = sum(seconds for _, seconds in taken)
    waited = own_work_s - own
    intervals = []
    for interval, seconds in taken:
        share = waited * seconds / measured if measured > 0 else 0.0
        remaining = seconds - interval.own_work_s - share
        if remaining > 0:
            intervals.append((interval, remaining))
    return intervals
