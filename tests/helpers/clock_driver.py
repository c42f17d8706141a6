"""The stage clock driven by hand: a host clock the test moves, a listener that keeps the intervals, and the clock's
hooks called as Lightning's loop calls them. No Trainer: the hooks get a namespace with the three things the clock
reads from one (`sanity_checking`, `state.fn`, `global_step`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from anemoi_profiler.clock import BatchCounter, LogIntervalReport, OwnWorkClock, RankTotals, StageClock
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.distributed.gradient_sync import GradientSyncTimer


class ManualTime:
    """What `time.perf_counter` would read, moved by the test."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CPU = torch.device("cpu")
BATCH = torch.zeros(8, 2)


class IntervalRecorder:
    """A listener that keeps every interval it is handed: (stage, step, batches, ms)."""

    def __init__(self) -> None:
        self.intervals: list[tuple[str, int, int, float]] = []
        self.ranks: list[list[RankTotals] | None] = []

    def on_log_interval(self, report: LogIntervalReport) -> None:
        self.intervals += [
            (report.stage, interval.step, interval.batches, seconds / interval.batches * 1000)
            for interval, seconds in report.intervals
        ]
        self.ranks.append(report.ranks)


class ClockDriver:
    """Calls the clock's hooks as Lightning's loop would, moving the manual time by each batch's duration."""

    def __init__(self, tmp_path: Path, *overrides: str, exchange: Any = None) -> None:
        self.time = ManualTime()
        self.own_work = OwnWorkClock(self.time)
        config = ProfilerConfig.load(None, [f"output_dir={tmp_path}", *overrides])
        self.clock = StageClock(
            config,
            CPU,
            exchange or RankExchange(),
            self.own_work,
            GradientSyncTimer(CPU, data_parallel_size=1, enabled=False),
            lambda: True,
            now=self.time,
        )
        self.recorder = IntervalRecorder()
        self.clock.join(self.recorder)
        self.clock.counter = BatchCounter()  # 8 samples a batch
        self.trainer = SimpleNamespace(sanity_checking=False, global_step=0, state=SimpleNamespace(fn="fit"))
        self.batches = 0

    def train_batches(self, *seconds: float, batches_per_step: int = 1) -> None:
        """Batches of `seconds` each; the optimizer steps after every `batches_per_step`-th (gradient
        accumulation), inside the batch, before its end hook, as in Lightning."""
        for duration in seconds:
            self.clock.train_batch_start()
            self.time.advance(duration)
            self.batches += 1
            self.trainer.global_step = self.batches // batches_per_step
            self.clock.train_batch_end(self.trainer, BATCH)

    def validation(self, *seconds: float, before_first_batch: float = 0.0) -> None:
        self.clock.validation_start(self.trainer)
        self.time.advance(before_first_batch)
        for duration in seconds:
            self.clock.validation_batch_start(self.trainer)
            self.time.advance(duration)
            self.clock.validation_batch_end(self.trainer, BATCH)
        self.clock.validation_end(self.trainer)
