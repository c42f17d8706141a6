"""Drive one StageMeter for training and one for validation from Lightning's batch hooks.

What a subclass gets: per log interval, `Lap`s with batches, samples, items, dataloader wait and elapsed
time, steady-state only (after `throughput.warmup_steps` training batches, never the sanity check), with
validation time excluded from training intervals. The hot path per batch is two `perf_counter` calls,
a few integer additions and a batch-size lookup; I/O, logging and any cross-rank exchange happen only at
log intervals.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import trainer_info
from .base import ProfilerCallback, guarded
from .intervals import Lap, StageMeter, resolve

log = logging.getLogger(__name__)

STAGES = ("train", "val")
# What each rank contributes per exchange, in this order.
TOTAL_KEYS = ("batches", "samples", "items", "wait_s", "elapsed_s")


class StageCallback(ProfilerCallback):
    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        device = trainer_info.root_device(trainer)
        # With one rank the profiler's own work is taken out of the intervals. With several, the other ranks
        # wait for it in their next collective, so taking it out on one rank only would skew the sum.
        overhead = self.session.overhead
        self._own_work = (lambda: overhead.total_s) if self.session.world_size == 1 else (lambda: 0.0)
        self.meters = {stage: StageMeter(device, self._own_work) for stage in STAGES}
        self._overhead_at_batch_end = 0.0
        self.totals = {stage: dict.fromkeys(TOTAL_KEYS, 0.0) for stage in STAGES}
        # Every rank's totals over the intervals that all ranks exchanged: what is global after a rank failed.
        self.exchanged: dict[str, list[list[float]]] = {stage: [] for stage in STAGES}
        self.reporting = True
        self.train_batches_seen = 0
        self._last_batch_end: float | None = None
        self._batch_start = 0.0

    # ---- what subclasses provide ----
    def count_batch(self, stage: str, batch: Any) -> tuple[int, int]:
        """(samples, items) in a batch; the base only counts batches."""
        return 0, 0

    def lap_extras(self, stage: str) -> dict[str, float]:
        """Host-side readings taken at the end of each interval (e.g. peak memory)."""
        return {}

    def on_laps(self, trainer: Any, stage: str, laps: list[tuple[Lap, float]], ranks: list[list[float]] | None) -> None:
        """Turn measured intervals into metrics. `ranks[r]` is rank r's `RankTotals` over the same laps."""

    # ---- training ----
    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.config.throughput.warmup_steps == 0:
            self.meters["train"].start()

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch_start = time.perf_counter()

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.train_batches_seen += 1
        meter = self.meters["train"]
        if meter.running:
            samples, items = self.count_batch("train", batch)
            meter.count(samples, items, self._wait_before_batch())
            if meter.batches >= self.config.log_every_n_steps:
                self._lap(trainer, "train")
        elif self.train_batches_seen == self.config.throughput.warmup_steps:
            meter.start()
        self._last_batch_end = time.perf_counter()
        self._overhead_at_batch_end = self._own_work()

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._lap(trainer, "train", final=True)
        self.meters["train"].stop()

    # ---- validation (never the sanity check) ----
    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.meters["train"].stop()
        self._last_batch_end = None

    @guarded
    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_start = time.perf_counter()
        if not trainer.sanity_checking:
            self.meters["val"].start()

    @guarded
    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if trainer.sanity_checking:
            return
        meter = self.meters["val"]
        samples, items = self.count_batch("val", batch)
        meter.count(samples, items, self._wait_before_batch())
        if meter.batches >= self.config.log_every_n_steps:
            self._lap(trainer, "val")
        self._last_batch_end = time.perf_counter()
        self._overhead_at_batch_end = self._own_work()

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        self._lap(trainer, "val", final=True)
        self.meters["val"].stop()
        if self.train_batches_seen >= self.config.throughput.warmup_steps and trainer.state.fn == "fit":
            self.meters["train"].start()
        self._last_batch_end = None

    # ---- helpers ----
    def _wait_before_batch(self) -> float:
        """Host time between the previous batch's end and this batch's start, the profiler's own work taken
        out: mostly waiting for data (other callbacks' end-of-batch work counts too)."""
        if self._last_batch_end is None:
            return 0.0
        profiler_work = self._own_work() - self._overhead_at_batch_end
        return max(0.0, self._batch_start - self._last_batch_end - profiler_work)

    def _lap(self, trainer: Any, stage: str, final: bool = False) -> None:
        meter = self.meters[stage]
        meter.lap(trainer_info.global_step(trainer), self.lap_extras(stage))
        laps = resolve(meter.take(keep_newest=not final))
        local = dict.fromkeys(TOTAL_KEYS, 0.0)
        for lap, seconds in laps:
            for key, value in zip(TOTAL_KEYS, (lap.batches, lap.samples, lap.items, lap.wait_s, seconds), strict=True):
                local[key] += value
                self.totals[stage][key] += value
        # Every rank reaches this point at the same batch count, so the collective lines up.
        ranks = None if self.session.failed else self.session.exchange.gather([local[k] for k in TOTAL_KEYS])
        if ranks:
            sums = self.exchanged[stage] or [[0.0] * len(TOTAL_KEYS) for _ in ranks]
            for rank_sums, rank_values in zip(sums, ranks, strict=True):
                for index, value in enumerate(rank_values):
                    rank_sums[index] += value
            self.exchanged[stage] = sums
        if laps and self.reporting:
            self._report_laps(trainer, stage, laps, ranks)

    def _report_laps(
        self, trainer: Any, stage: str, laps: list[tuple[Lap, float]], ranks: list[list[float]] | None
    ) -> None:
        """Run `on_laps`, whose work is rank 0's alone, so that an error there cannot stop this rank's exchanges.

        Disabling the whole callback on one rank would leave the others waiting for it in the next exchange
        for `distributed.timeout_s`, and pair their collectives with another callback's.
        """
        try:
            self.on_laps(trainer, stage, laps, ranks)
        except Exception as error:
            self.reporting = False
            log.warning(
                "anemoi-profiler: %s stopped logging interval metrics after an error: %s: %s (training continues)",
                type(self).__name__,
                type(error).__name__,
                error,
            )

    def gathered_totals(self, stage: str) -> list[list[float]]:
        """Every rank's totals for the stage at the end.

        Once the ranks can no longer exchange (one failed), the totals of the intervals they all exchanged
        before: this rank's own totals alone would pass for the sum over ranks.
        """
        local = [self.totals[stage][key] for key in TOTAL_KEYS]
        if self.session.world_size == 1:
            return [local]
        ranks = None if self.session.failed else self.session.exchange.gather(local)
        return ranks or self.exchanged[stage]
