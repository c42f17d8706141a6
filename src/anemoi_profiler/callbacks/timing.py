"""Step time, dataloader and collective waits, and peak memory per log interval.

The stage clock measures them all (memory peaks once this callback asks for them, see `clock.memory_peaks`);
this callback logs them per log interval and sums them up at the end.
"""

from __future__ import annotations

from typing import Any

from anemoi_profiler import names
from anemoi_profiler.callbacks.stage_callback import StageCallback
from anemoi_profiler.clock import STAGES, LogIntervalReport, MemoryPeaks, RankTotals
from anemoi_profiler.clock.rank_figures import (
    collective_wait_figures,
    describe_ranks,
    gap_figures,
    memory_figures,
    rank_waited_for,
    step_figures,
)
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.reports import steady
from anemoi_profiler.trainer import trainer_info


class StepTimingCallback(StageCallback):
    """Logs `time/{train,val}/step_ms`, data and collective waits and `memory/...` per interval (see `rank_figures`).

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
    """

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_session_start(trainer, pl_module)
        self.clock.memory = MemoryPeaks(trainer_info.root_device(trainer))
        self.intervals = {stage: steady.IntervalLog() for stage in STAGES}
        """Rank 0's log intervals with the times logged for each: the steady figures are made of them."""

    def on_log_interval(self, report: LogIntervalReport) -> None:
        if not self.session.is_global_zero:
            return
        stage = report.stage
        for interval, seconds in report.intervals:
            metrics = dict(interval.extras)
            if self.session.world_size > 1:  # with one rank these equal the figures below
                metrics[names.timing(stage, "device/step_ms")] = seconds / interval.batches * 1000
            self.session.log_metrics(metrics, interval.step)
        if report.ranks:
            across = self._across_ranks(stage, report.ranks)
            self.session.log_metrics(across, report.step)
            times = {key: value for key, value in across.items() if not key.startswith(names.MEMORY)}
            batches = sum(interval.batches for interval, _ in report.intervals)
            seconds = sum(seconds for _, seconds in report.intervals)
            self.intervals[stage].append(report.step, batches, seconds, times)

    def _across_ranks(self, stage: str, ranks: list[RankTotals]) -> dict[str, float]:
        metrics = step_figures(stage, ranks)
        if metrics:
            metrics |= gap_figures(stage, ranks)
        if stage == "train" and metrics:
            metrics |= collective_wait_figures(ranks) | memory_figures(ranks)
        return metrics

    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        values: dict[str, tuple[Any, str]] = {}
        summary: dict[str, float] = {}
        gathered = {stage: self.gathered_totals(stage) for stage in STAGES}  # a collective: every rank
        for stage in STAGES:
            across = self._across_ranks(stage, gathered[stage])  # memory peaks and ranks over the whole run
            split = steady.split(self.intervals[stage].intervals())
            times = steady.combined(split.steady)
            if times:
                across = times | {key: value for key, value in across.items() if key not in times}  # step_ms first
            else:
                across = {key: value for key, value in across.items() if key.startswith(names.MEMORY)}
            for key, value in across.items():
                name = names.summary_of(key).removeprefix(names.SUMMARY)
                summary[names.summary(name)] = value
                values[name] = _with_unit(name, value)
            step_ms = times.get(names.timing(stage, "step_ms"))
            if stage == "train" and step_ms:
                wait_ms = times.get(names.TRAIN_DATALOADER_WAIT_MS)
                share = (wait_ms / step_ms * 100, "%") if wait_ms is not None else ("not assessed", "")
                values["train/dataloader_wait_share"] = share
        peaks = self.clock.memory.peaks if self.clock.memory is not None else {}
        for key, value in peaks.items():
            values[key.replace(names.MEMORY, "max ")] = (value, "MB")
            summary[names.summary_of(key)] = value
        if not values or not self.session.is_global_zero:
            return [], {}
        callbacks = self.clock.gaps.callbacks_ms()
        if callbacks:
            values["other callbacks between steps (sampled)"] = (_named(callbacks), "")
        note = (
            "Per batch: step = the whole cadence; within it, data wait = the fetch from the dataloader, callbacks = "
            "other callbacks' batch hooks between the steps, loop = Lightning's loop between batches."
        )
        sections = [ReportSection.key_values("Step time and memory", values, note)]
        ranks = self._ranks_section(summary, gathered["train"])
        return sections + ([ranks] if ranks is not None else []), summary

    def _ranks_section(self, summary: dict[str, float], train: list[RankTotals]) -> ReportSection | None:
        """How ranks share the work and who waits for whom, with host names; data the diagnosis reads too."""
        session = self.session
        if session.world_size < 2:
            return None
        parallelism, hosts = session.parallelism, session.hosts
        values: dict[str, tuple[Any, str]] = {
            "world size": (session.world_size, ""),
            "data-parallel replicas": (f"{parallelism.data_parallel_size} (from {parallelism.source})", ""),
            "hosts": (describe_ranks(hosts), ""),
        }
        reason = self.clock.gradient_sync.not_assessed
        values["collective wait"] = (f"not assessed: {reason}" if reason else "measured per optimizer step", "")
        for label, found in (
            ("the rank the others wait for", rank_waited_for(train)),
            ("largest data wait on", summary.get(names.SUMMARY_TRAIN_DATALOADER_SLOWEST_RANK)),
        ):
            if found is not None:
                rank = int(found)
                values[label] = (f"rank {rank} ({hosts[rank] if rank < len(hosts) else 'host unknown'})", "")
        return ReportSection.key_values("Ranks", values)


def _named(milliseconds: dict[str, float]) -> str:
    """`ModelCheckpoint 0.12 ms, ...`: by class, not by Lightning's state key (a class name and its arguments)."""
    by_class: dict[str, float] = {}
    for state_key, value in milliseconds.items():
        name = state_key.split("{", 1)[0]
        by_class[name] = by_class.get(name, 0.0) + value
    return ", ".join(f"{name} {value:.2f} ms" for name, value in list(by_class.items())[:5])


def _with_unit(name: str, value: float) -> tuple[Any, str]:
    if name.endswith("_rank"):
        return int(value), ""
    return value, "MB" if name.startswith(names.MEMORY) else "ms"
