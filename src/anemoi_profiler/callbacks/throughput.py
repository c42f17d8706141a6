"""Training and validation throughput: samples/s, batches/s, items/s, per device and global, and MFU.

Unlike Lightning's ThroughputMonitor, nothing here synchronizes the device per step (a sync drains the device's
queue and lengthens the step it measures): intervals are timed with CUDA events read an interval later (see
`clock.intervals`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from anemoi_profiler import names
from anemoi_profiler.callbacks.stage_callback import StageCallback
from anemoi_profiler.clock import STAGES, BatchCounter, FirstStepFlops, LogIntervalReport, RankTotals, is_compiled
from anemoi_profiler.clock.rank_figures import rank_waited_for
from anemoi_profiler.config import ConfigError, ConfigSource, ProfilerConfig
from anemoi_profiler.measure.flops import dense_peak_flops
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.reports import steady
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.trainer import trainer_info


def import_function(path: str) -> Callable[..., Any]:
    """Load 'package.module:function', naming the problem if it cannot."""
    module_name, _, attribute = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot import {path!r}: {error}") from None
    if not callable(function):
        raise ConfigError(f"{path!r} is not callable")
    return function


class ThroughputCallback(StageCallback):
    """Logs `throughput/{train,val}/...` every `log_every_n_steps` batches and `summary/...` at the end.

    `length_fn(batch) -> int` counts items (tokens, grid points) for `items_per_sec`; `batch_size_fn`
    overrides the default sample count (dim 0 of the first tensor in the batch). Both may also be given as
    'module:function' strings in the config. Return Python ints: reading a CUDA tensor forces a sync.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
        length_fn: Counts the items of a batch; None: `throughput.length_fn`, else no item rates.
        batch_size_fn: Counts the samples of a batch; None: `throughput.batch_size_fn`, else dim 0 of the
            batch's first tensor.
    """

    def __init__(
        self,
        config: ProfilerConfig | ConfigSource | None = None,
        session: ProfilerSession | None = None,
        length_fn: Callable[[Any], int] | None = None,
        batch_size_fn: Callable[[Any], int] | None = None,
    ) -> None:
        super().__init__(config, session)
        options = self.config.throughput
        self.length_fn = length_fn or (import_function(options.length_fn) if options.length_fn else None)
        self.batch_size_fn = batch_size_fn or (
            import_function(options.batch_size_fn) if options.batch_size_fn else None
        )
        self.intervals = {stage: steady.IntervalLog() for stage in STAGES}
        """Rank 0's log intervals with the rates logged for each: the steady figures are made of them."""

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_session_start(trainer, pl_module)
        options = self.config.throughput
        self.world_size = trainer_info.world_size(trainer)
        device = trainer_info.root_device(trainer)
        name, units = "cpu", None
        if device.type == "cuda":  # ROCm devices too: their compute units tell an MI250 GCD from an MI250X's
            name = torch.cuda.get_device_name(device)
            units = torch.cuda.get_device_properties(device).multi_processor_count
        self.peak_flops = options.device_peak_flops or dense_peak_flops(name, trainer_info.precision(trainer), units)
        configured = options.flops_per_sample
        self.clock.counter = BatchCounter(self.batch_size_fn, self.length_fn)
        self.clock.flops_per_sample = configured / self.session.parallelism.ranks_per_replica if configured else 0.0
        if options.measure_flops and self.peak_flops and not configured:
            # configure_model shards the module in place after this hook: the clock reads it at the first step
            self.clock.flops = FirstStepFlops(pl_module, self.session.parallelism.ranks_per_replica)
        self._pl_module = pl_module

    @property
    def flops_per_sample(self) -> float | None:
        """This rank's share of a sample's FLOPs: a configured figure is the whole model's, split over a replica's
        ranks; a counted one (on the first training step, see `clock.step_flops`) is already what this rank
        computes. None when unknown."""
        return self.clock.flops_per_sample or None

    # ---- metrics ----
    def on_log_interval(self, report: LogIntervalReport) -> None:
        if not self.session.is_global_zero:
            return
        stage, intervals, ranks = report.stage, report.intervals, report.ranks
        for interval, seconds in intervals:
            self.session.log_metrics(
                self._device_rates(stage, interval.batches, interval.samples, interval.items, seconds), interval.step
            )
        batches = sum(interval.batches for interval, _ in intervals)
        seconds = sum(seconds for _, seconds in intervals)
        samples = sum(interval.samples for interval, _ in intervals)
        items = sum(interval.items for interval, _ in intervals)
        figures = self._device_rates(stage, batches, samples, items, seconds)
        if ranks:
            global_rates = self._global_rates(stage, ranks)
            figures |= global_rates
            self.session.log_metrics(global_rates | _slowest_rank(stage, ranks), report.step)
        self.intervals[stage].append(report.step, batches, seconds, figures)

    def _device_rates(
        self, stage: str, batches: float, samples: float, items: float, seconds: float
    ) -> dict[str, float]:
        prefix = names.throughput(stage, "device")
        metrics = {f"{prefix}/batches_per_sec": batches / seconds}
        if samples:
            metrics[f"{prefix}/samples_per_sec"] = samples / seconds
        if items:
            metrics[f"{prefix}/items_per_sec"] = items / seconds
        return metrics

    def _global_rates(self, stage: str, ranks: list[RankTotals]) -> dict[str, float]:
        """Every rank's rate over the same intervals, summed, with each data-parallel replica's samples once.

        The ranks of a replica (tensor parallel, anemoi's model groups) see the same batches and samples, so the
        sum over ranks is divided by the ranks per replica; items too, unless each rank holds its own slice
        (`distributed.item_counting=rank`). MFU sums each rank's own FLOPs against every rank's peak.
        """
        timed = [rank for rank in ranks if rank.elapsed_s > 0]
        if not timed:
            return {}
        per_replica = self.session.parallelism.ranks_per_replica
        items_per_replica = per_replica if self.config.distributed.item_counting == "replica" else 1
        prefix = names.THROUGHPUT + stage
        metrics = {f"{prefix}/batches_per_sec": sum(r.batches / r.elapsed_s for r in timed) / per_replica}
        samples_per_sec = sum(r.samples / r.elapsed_s for r in timed) / per_replica
        if samples_per_sec:
            metrics[f"{prefix}/samples_per_sec"] = samples_per_sec
        items_per_sec = sum(r.items / r.elapsed_s for r in timed) / items_per_replica
        if items_per_sec:
            metrics[f"{prefix}/items_per_sec"] = items_per_sec
        if stage == "train" and self.peak_flops and all(r.flops_per_sample for r in timed):
            achieved = sum(r.flops_per_sample * r.samples / r.elapsed_s for r in timed)
            if achieved:
                metrics[f"{prefix}/mfu"] = achieved / (self.peak_flops * len(ranks))
        return metrics

    def steady_rates(self, stage: str) -> dict[str, float]:
        """The stage's steady figures by metric name (`reports.steady`): the headline, on rank 0."""
        return steady.combined(steady.split(self.intervals[stage].intervals()).steady)

    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        values: dict[str, tuple[Any, str]] = {}
        summary: dict[str, float] = {}
        gathered = {stage: self.gathered_totals(stage) for stage in STAGES}  # a collective: every rank
        for stage, ranks in gathered.items():
            split = steady.split(self.intervals[stage].intervals())
            seen = self.clock.train_batches_seen
            if stage == "train" and seen and not split.steady:
                warmup = self.config.throughput.warmup_steps
                values["train/samples_per_sec"] = (f"{steady.NOT_ENOUGH} ({seen} batches, warmup {warmup})", "")
            rates = steady.headline_first(steady.combined(split.steady))
            for key, value in rates.items():
                name = key.removeprefix(names.THROUGHPUT)
                summary[names.summary_of(key)] = value
                if name.endswith("mfu"):
                    values[f"{name}_percent"] = (value * 100, "%")
                else:
                    values[name] = (value, "/s")
            if split.slow:  # after the headline rates
                self._slow_stretch_figures(stage, split, values, summary)
            for key, value in _slowest_rank(stage, ranks).items():
                summary[names.summary_of(key)] = value
                values[key.removeprefix(names.THROUGHPUT)] = (int(value), "")
            if stage == "train":
                self._all_in_figures(ranks, split, values, summary)
            elif rates and ranks:
                values[f"{stage}/measured_batches"] = (int(sum(r.batches for r in ranks)), "")
                if split.slow:
                    values[f"{stage}/steady_batches"] = (int(split_batches(split.steady)), "")
        if self.flops_per_sample:
            values["train/flops_per_sample"] = (self.flops_per_sample, "FLOP")
        epoch_start_note = self._epoch_start_figures(trainer, gathered["train"], values, summary)
        if not values or not self.session.is_global_zero:
            return [], {}
        parallelism = self.session.parallelism
        notes = [
            f"Rates: {steady.DEFINITION} (warmup: {self.config.throughput.warmup_steps} training batches; validation "
            f"and the profiler's own work not in training time; *_all_in: {steady.ALL_IN}). Global: every rank's rate "
            "summed over "
            f"{self.world_size} rank(s), each of the "
            f"{parallelism.data_parallel_size} data-parallel replica(s) of {parallelism.ranks_per_replica} rank(s) "
            f"counted once ({parallelism.source}); device: rank {self.session.global_rank}."
        ]
        if epoch_start_note:
            notes.append(epoch_start_note)
        overlap_s, measured_s = self._startup_overlap_s()
        if overlap_s:
            values["train/startup_overlap_s"] = (overlap_s, "s")
            values["train/measured_s"] = (measured_s, "s")
            summary[names.SUMMARY_TRAIN_STARTUP_OVERLAP_S] = overlap_s
            share = "All" if overlap_s >= measured_s else f"The first {overlap_s:.2g} s"
            notes.append(
                f"{share} of the measured training ({measured_s:.2g} s) ran beside the profiler's own start-up (its "
                "MLflow sender, a separate process, importing MLflow and creating the run), which can read them "
                "slower even with a core free for it. A longer run or more warmup_steps measures without it."
            )
        if is_compiled(self._pl_module) and self.flops_per_sample:
            notes.append(
                "The model is compiled: its FLOPs were counted on the first step run eagerly (the operators the "
                "compiled graphs compute); the rates and MFU are the compiled steps'."
            )
        return [ReportSection.key_values("Throughput", values, " ".join(notes))], summary

    def _slow_stretch_figures(
        self, stage: str, split: steady.Split, values: dict[str, tuple[Any, str]], summary: dict[str, float]
    ) -> None:
        """The slow stretches' own figures: their seconds, their share of the stage's measured time, their rate."""
        slow_s = sum(interval.seconds for interval in split.slow)
        share = slow_s / (slow_s + sum(interval.seconds for interval in split.steady))
        figures = {"s": slow_s, "share": share}
        rate = steady.combined(split.slow).get(names.throughput(stage, "samples_per_sec"))
        if rate:
            figures["samples_per_sec"] = rate
        for name, value in figures.items():
            summary[names.slow_stretch(stage, name)] = value
        steps = steady.stretch_steps(split.slow)
        values[f"{stage}/slow_stretch_intervals"] = (f"{len(split.slow)} (ending at step {steps})", "")
        values[f"{stage}/slow_stretch_s"] = (slow_s, "s")
        values[f"{stage}/slow_stretch_share"] = (share * 100, "%")
        if rate:
            values[f"{stage}/slow_stretch_samples_per_sec"] = (rate, "/s")

    def _all_in_figures(
        self,
        ranks: list[RankTotals],
        split: steady.Split,
        values: dict[str, tuple[Any, str]],
        summary: dict[str, float],
    ) -> None:
        """The all-in rates (`RankTotals.all_in`): every training batch after the warmup over every second of it,
        written whenever a batch was measured; and the batches each figure counts."""
        whole = [rank.all_in() for rank in ranks]
        if not any(rank.batches for rank in whole):
            return
        values["train/measured_batches"] = (int(sum(rank.batches for rank in whole)), "")
        values["train/steady_batches"] = (int(split_batches(split.steady)), "")
        left_out = sum(rank.left_out_batches for rank in ranks)
        if left_out:
            values["train/left_out_batches"] = (int(left_out), "")
        for key, value in self._global_rates("train", whole).items():
            if not key.endswith("mfu"):
                summary[names.all_in(key)] = value
                values[names.all_in(key).removeprefix(names.SUMMARY)] = (value, "/s")

    def _epoch_start_figures(
        self, trainer: Any, ranks: list[RankTotals], values: dict[str, tuple[Any, str]], summary: dict[str, float]
    ) -> str | None:
        """The time from each measured epoch's start to its first batch, which the steady rates leave out: its
        seconds and its share of the all-in training time; the all-in rates count it, and are written under their
        older names `..._with_epoch_starts` too.

        With several ranks, the longest rank's, which the clock made every rank's (the others wait for it in the
        epoch's first step, see `StageClock.end_interval`)."""
        ranks = [rank for rank in ranks if rank.elapsed_s > 0]
        if not any(rank.epoch_starts for rank in ranks):
            return None
        slowest = max(ranks, key=lambda rank: rank.epoch_start_s)
        seconds, starts = slowest.epoch_start_s, int(slowest.epoch_starts)
        share = seconds / slowest.all_in_s if slowest.all_in_s > 0 else 0.0
        summary |= {
            names.SUMMARY_TRAIN_EPOCH_STARTS: starts,
            names.SUMMARY_TRAIN_EPOCH_START_S: seconds,
            names.SUMMARY_TRAIN_EPOCH_START_SHARE: share,
        }
        values |= {"train/epoch_starts": (starts, ""), "train/epoch_start_s": (seconds, "s")}
        values["train/epoch_start_share"] = (share * 100, "%")
        for key, value in self._global_rates("train", [rank.all_in() for rank in ranks]).items():
            if not key.endswith("mfu"):
                summary[names.with_epoch_starts(key)] = value  # the all-in rate, under its older name
        workers = trainer_info.train_dataloader_workers(trainer)
        if workers is not None:
            values["train/dataloader_workers"] = (workers[0], "")
            if workers[0]:  # without worker processes there is nothing to keep
                values["train/persistent_workers"] = (workers[1], "")
        longest = " (the rank with the longest: the others wait for it)" if len(ranks) > 1 else ""
        return (
            f"Epoch starts are not in the steady rates and step times: from each epoch's start (on_train_epoch_start) "
            f"to its first batch, the DataLoader's workers start again unless persistent_workers=True, and reopen "
            f"the dataset. {starts} measured epoch start(s) took {seconds:.3g} s{longest}, {share:.1%} of the "
            "all-in training time; the *_all_in rates include them."
        )

    def _startup_overlap_s(self) -> tuple[float, float]:
        """Seconds of measured training that ran while the profiler's start-up work went on beside it, and the
        span of measured training (from its first measured batch to its end)."""
        meter = self.clock.meters["train"]
        startup_until = self.session.startup_work_until()
        if meter.first_started_at is None or meter.last_stopped_at is None or startup_until is None:
            return 0.0, 0.0
        measured_s = meter.last_stopped_at - meter.first_started_at
        return max(0.0, min(startup_until, meter.last_stopped_at) - meter.first_started_at), measured_s


def split_batches(intervals: list[steady.Interval]) -> float:
    return sum(interval.batches for interval in intervals)


def _slowest_rank(stage: str, ranks: list[RankTotals]) -> dict[str, float]:
    """`throughput/train/slowest_rank`, the rank the others wait for, where every rank timed its gradient sync."""
    rank = rank_waited_for(ranks) if stage == "train" else None
    return {} if rank is None else {names.TRAIN_SLOWEST_RANK: float(rank)}
