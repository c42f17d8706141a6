"""Profiling windows with torch.profiler during a Lightning fit: traces, time and memory reports.

Unlike Lightning's PyTorchProfiler, `repeat` is honoured, validation gets its own windows (counted per
validation run, never in the sanity check), each window's trace lands in its own folder named by stage and
rank for HTA, and a batch outside the windows costs one integer comparison: the profiler starts at the
first scheduled batch and stops after the last cycle.
"""

from __future__ import annotations

import bisect
import math
import time
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.callbacks.base import ProfilerCallback, guarded
from anemoi_profiler.callbacks.memory_snapshot import WindowSnapshot
from anemoi_profiler.clock import STAGES, unwrapped
from anemoi_profiler.cluster.window_exchange import WindowExchange, window_section
from anemoi_profiler.config import ConfigSource, ProfilerConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.profiling.operator_reports import summarize_windows
from anemoi_profiler.profiling.schedule import WindowSchedule
from anemoi_profiler.profiling.stage_profile import WindowRecorder
from anemoi_profiler.profiling.traces import TracesUpload
from anemoi_profiler.profiling.windows import ProfilingWindows
from anemoi_profiler.report_sections import ReportSection, format_value
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.run.window_triggers import (
    TRIGGERS_TAG,
    TriggerWatch,
    WindowPlan,
    window_entries,
    windows_section,
    write_windows,
)
from anemoi_profiler.run_files.layout import TRACES_DIR, window_snapshot_path
from anemoi_profiler.run_files.steps_file import PROFILED
from anemoi_profiler.trainer import trainer_info
from anemoi_profiler.triggers.requests import SERVED_TAG, served_tag

log = get_logger(__name__)


class TorchProfilerCallback(ProfilerCallback):
    """Records `profiler.train` and `profiler.val` windows; writes `traces/`, `time_report.*`, `memory_report.*`.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
        scheduled: Record the `profiler.train`/`profiler.val` windows. False: only triggered and requested
            windows (what `build_callbacks` adds for triggers without the profiler).
    """

    def __init__(
        self,
        config: ProfilerConfig | ConfigSource | None = None,
        session: ProfilerSession | None = None,
        scheduled: bool = True,
    ) -> None:
        super().__init__(config, session)
        self._scheduled = scheduled
        self._watch: TriggerWatch | None = None
        self._windows: ProfilingWindows | None = None
        self._recorders: dict[str, WindowRecorder | None] = dict.fromkeys(STAGES)
        self._window_exchange: WindowExchange | None = None
        self._peer_windows: list[tuple[int, float]] = []

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        conflicting = _torch_based_profiler(trainer)
        if conflicting:
            log.warning(
                "the Trainer runs Lightning's %s (profiler=...), which also uses torch.profiler; "
                "two torch profilers cannot run at once, so TorchProfilerCallback is off for this run (training "
                "continues). Remove profiler= from the Trainer to get anemoi-profiler's windows, traces and reports.",
                conflicting,
            )
            self.disabled = True
            if self.session.triggers is not None:
                self.session.triggers.close()
            return
        options = self.config.profiler
        assert self.session.run_dir is not None
        self._schedules = {stage: WindowSchedule.from_config(getattr(options, stage)) for stage in STAGES}
        # A rank outside `distributed.profiled_ranks` keeps empty spans: each batch costs one comparison.
        profiled = self.session.global_rank in self.session.profiled_ranks
        self._watch = self.session.triggers
        self._triggered: WindowPlan | None = None  # the triggered window this rank records now
        self._unstarted: WindowPlan | None = None  # the last one opened, until its first recorded batch starts
        self._snapshot: WindowSnapshot | None = None  # and its memory snapshot, on CUDA
        self._device_type = trainer_info.root_device(trainer).type
        self._windows = None
        if profiled or self._watch is not None:  # a triggered window may name any rank
            self._windows = ProfilingWindows(
                self.session.run_dir,
                self.session.global_rank,
                self.session.world_size,
                options,
                trainer_info.root_device(trainer),
            )
        self._recorders = dict.fromkeys(STAGES)
        self._window_exchange = self._exchange_windows() if options.window_summary else None
        scheduled = profiled and self._scheduled
        self._spans = {stage: (s.start, s.end) if scheduled else (0, 0) for stage, s in self._schedules.items()}
        self._scheduled_spans = dict(self._spans)
        # Each training step's all-reduce makes every rank wait for the profiled ones: a rank outside
        # `profiled_ranks` runs a peer's window at the window's pace, so it leaves those steps out too (one set of
        # steady steps on every rank). Sorted (start, end) batch spans, dropped once passed.
        train = self._schedules["train"]
        peers = self._scheduled and not profiled and self.session.world_size > 1 and self.session.profiled_ranks
        self._peer_windows = [(train.start, train.end)] if peers else []
        if self.session.is_global_zero:
            self.session.after_release(self._list_windows)
        self._publish_status()
        self._batches = dict.fromkeys(STAGES, 0)  # train: over the whole fit; val: in this validation run
        self._val_profiled = False
        self._val_length_checked = False
        self._timing = False  # the current batch is inside a profiling cycle
        self._batch_start = self._backward_start = self._optimizer_start = 0.0
        self._last_train_end: float | None = None

    # ---- training ----
    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        batches = _planned_train_batches(trainer)
        if batches is not None and self._windows is not None:
            self._warn_shortfall("train", batches, "the training run")

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._watch is not None and self._watch.pending is not None and self._recorders["train"] is None:
            with self.session.own_work.measure():  # answering a request writes a file: not training time
                self._open_triggered(self._batches["train"])
        if self._unstarted is not None and self._batches["train"] == self._unstarted.start_batch:
            self._unstarted.start_step, self._unstarted = trainer_info.global_step(trainer), None
        start, end = self._spans["train"]
        if start <= self._batches["train"] < end:
            self._begin_batch("train")
        elif self._peer_windows:
            self._in_peer_window(self._batches["train"])

    @guarded
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._timing:
            self._backward_start = time.perf_counter()

    @guarded
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self._timing:
            self._durations_add("train/backward", self._backward_start)

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._timing:
            self._optimizer_start = time.perf_counter()

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches["train"] += 1
        if not self._timing:
            return
        self._durations_add("train/training_step", self._batch_start)
        if self._optimizer_start > self._batch_start:
            self._durations_add("train/optimizer_step", self._optimizer_start)
        self._end_batch("train", trainer_info.global_step(trainer))
        self._last_train_end = time.perf_counter()

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._timed_stop("train", trainer_info.global_step(trainer))

    # ---- validation: each run counts its own batches; the sanity check is never profiled ----
    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_train_end = None  # the next training batch's wait is not the dataloader's
        self._val_profiled = False
        if self._windows is None or getattr(trainer, "sanity_checking", False) or not self.config.profiler.validation:
            return
        training = self._recorders["train"]
        if training is not None and training.busy:
            log.info(
                "a validation run started inside a training profiling window; it is not profiled "
                "on its own and shows in the training trace"
            )
            return
        if not self._val_length_checked:
            self._val_length_checked = True
            batches = _validation_batches(trainer)
            if batches is not None:
                self._warn_shortfall("val", batches, "each validation run")
        self._val_profiled = True
        self._batches["val"] = 0

    @guarded
    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self._val_profiled:
            return
        start, end = self._spans["val"]
        if start <= self._batches["val"] < end:
            self._begin_batch("val")

    @guarded
    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self._val_profiled:
            return
        self._batches["val"] += 1
        if self._timing:
            self._durations_add("val/validation_batch", self._batch_start)
            self._end_batch("val", trainer_info.global_step(trainer))

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._timed_stop("val", trainer_info.global_step(trainer))
        self._val_profiled = False

    # ---- windows ----
    def _in_peer_window(self, batch: int) -> None:
        """Flag the training step at `batch` when another rank records a window there (see `on_session_start`)."""
        windows = self._peer_windows
        while windows and batch >= windows[0][1]:
            windows.pop(0)
        if windows and windows[0][0] <= batch and self.session.stage_clock is not None:
            self.session.stage_clock.steps.mark("train", PROFILED)

    def _begin_batch(self, stage: str) -> None:
        assert self._windows is not None
        index = self._batches[stage]
        schedule = self._schedules[stage]
        self._windows.batch_starting(stage, schedule, index)
        if self._recorders[stage] is None:
            self._recorders[stage] = self._windows.open(stage, schedule, index)
        if self._recorders[stage] is not None and self.session.stage_clock is not None:
            self.session.stage_clock.steps.mark(stage, PROFILED)  # not steady state for `compare`
        now = time.perf_counter()
        if stage == "train" and self._last_train_end is not None:
            self._windows.durations.add("train/dataloader_next", now - self._last_train_end)
        self._timing = True
        self._batch_start = now

    def _end_batch(self, stage: str, step: int) -> None:
        """Step the stage's profiler after its batch (already counted) and stop it after the last cycle; `step`:
        the trainer's global step, which a window ending here logs its figures at."""
        assert self._windows is not None
        self._timing = False
        recorder = self._recorders[stage]
        if recorder is None:
            return
        finished = self._batches[stage] - 1
        closed_before, started = len(self._windows.closed), time.perf_counter()
        with self.session.own_work.measure():  # closing a window, trace export: not training time
            self._windows.batch_ended(recorder, finished, step)
            if finished + 1 >= self._spans[stage][1]:
                self._stop(stage)
        self._note_end_held(closed_before, started, step)

    def _timed_stop(self, stage: str, step: int) -> None:
        """Stop the stage's profiler at the end of its run; a window it cuts short ends here."""
        if self._windows is None:
            self._stop(stage)
            return
        closed_before, started = len(self._windows.closed), time.perf_counter()
        self._stop(stage)
        self._note_end_held(closed_before, started, step)

    def _note_end_held(self, closed_before: int, started: float, step: int) -> None:
        """Say how long the windows that ended since `started` held the training thread: windows.json, the
        report's windows table and, from rank 0, `window/<stage>/end_held_ms` (no device sync: wall time)."""
        assert self._windows is not None
        held_s = time.perf_counter() - started
        for stage, _ in self._windows.note_end_held(closed_before, held_s):
            if self.session.is_global_zero:
                self.session.log_metrics({names.window_end_held(stage): held_s * 1000}, step=step)

    def _open_triggered(self, batch: int) -> None:
        """Open the pending triggered window at `batch` on the ranks it names; every rank numbers it the same.

        It waits while it would overlap the scheduled training windows (one torch profiler at a time).
        """
        assert self._watch is not None and self._watch.pending is not None and self._windows is not None
        schedule = self._schedules["train"]
        length = self._watch.warmup + self._watch.steps
        if self._scheduled and batch + length > schedule.start and batch < schedule.end:
            return
        scheduled_before = schedule.repeat if self._scheduled and batch >= schedule.end else 0
        plan = self._watch.open_pending(scheduled_before + len(self._watch.plans), batch + self._watch.warmup)
        assert plan is not None and plan.window is not None
        self._unstarted = plan
        self._windows.number_next_window("train", plan.window)
        if self.session.global_rank in plan.ranks:
            triggered = WindowSchedule(batch, 0, plan.warmup, plan.steps, 1)
            self._schedules["train"], self._spans["train"] = triggered, (triggered.start, triggered.end)
            self._triggered = plan
            if plan.memory and self._device_type == "cuda":
                self._start_snapshot(plan)
        else:
            self._windows.number_next_window("train", plan.window + 1)
            bisect.insort(self._peer_windows, (batch, batch + plan.warmup + plan.steps))
        if self.session.is_global_zero:  # listed now: a job that dies later still says why the window opened
            self._write_windows()
            if plan.request is not None and self.session.sink is not None:
                self.session.sink.set_tags({SERVED_TAG: served_tag(plan.request)})
        self._publish_status()

    def _list_windows(self) -> ReportSection | None:
        """Rank 0, after the other ranks wrote their traces: windows.json and the report's list of windows."""
        entries = self._write_windows()
        self._publish_status()
        return windows_section(entries)

    def _write_windows(self) -> list[dict[str, Any]]:
        assert self.session.run_dir is not None
        plans = self._watch.plans if self._watch is not None else []
        active = {stage: schedule.active for stage, schedule in self._configured_schedules().items()}
        held = self._windows.end_held_s if self._windows is not None else {}
        entries = window_entries(self.session.run_dir, plans, active, self._device_type, held)
        write_windows(self.session.run_dir, entries)
        return entries

    def _publish_status(self) -> None:
        """Rank 0: the run's `profiler.triggers` tag says what is armed, the windows left, the last trigger."""
        if self._watch is not None and self.session.is_global_zero and self.session.sink is not None:
            self.session.sink.set_tags({TRIGGERS_TAG: self._watch.status()})

    def _configured_schedules(self) -> dict[str, WindowSchedule]:
        return {stage: WindowSchedule.from_config(getattr(self.config.profiler, stage)) for stage in STAGES}

    def _durations_add(self, name: str, since: float) -> None:
        assert self._windows is not None
        self._windows.durations.add(name, time.perf_counter() - since)

    def _stop(self, stage: str) -> None:
        recorder, self._recorders[stage] = self._recorders[stage], None
        if recorder is not None:
            recorder.stop()
        if stage == "train" and self._triggered is not None:  # back to the scheduled windows
            self._dump_snapshot(self._triggered)
            self._triggered = None
            self._schedules["train"] = self._configured_schedules()["train"]
            self._spans["train"] = self._scheduled_spans["train"]

    def _start_snapshot(self, plan: WindowPlan) -> None:
        options = self.config.memory_snapshot
        try:
            self._snapshot = WindowSnapshot(options.max_entries, shared=options.enabled)
        except Exception as error:  # the window's trace goes on without it
            log.warning("no memory snapshot of window %s: %s", plan.window, error)

    def _dump_snapshot(self, plan: WindowPlan) -> None:
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None or plan.window is None or self.session.run_dir is None:
            return
        path = window_snapshot_path(self.session.run_dir, self.session.global_rank, plan.window)
        try:
            snapshot.dump(path, f"{plan.reason} window {plan.window}")
        except Exception as error:  # a snapshot never ends the training it observes
            log.warning("no memory snapshot of window %d: %s", plan.window, error)

    def _warn_shortfall(self, stage: str, batches: int, run: str) -> None:
        problem = self._schedules[stage].shortfall(batches, f"profiler.{stage}", run)
        if problem:
            log.warning("%s", problem)

    # ---- end of run ----
    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        """Rank 0 decides on the trace upload; the first profiled rank writes the reports from its windows."""
        for stage in STAGES:
            self._stop(stage)
        if self._windows is not None:
            self._windows.flush()
        across_ranks = None
        if self._window_exchange is not None:
            self._window_exchange.finish()
            if self.session.is_global_zero:
                across_ranks = window_section(self._window_exchange.tables)
        upload_note = self._traces_upload_note() if self.session.is_global_zero else ""
        sections = [across_ranks] if across_ranks is not None else []
        if self._windows is None or self.session.global_rank != self._reporting_rank():
            return sections, {}
        operator_sections, metrics = summarize_windows(self._windows, upload_note)
        return sections + operator_sections, metrics

    def _exchange_windows(self) -> WindowExchange:
        """Every rank, profiled or not, joins the exchanges: at training intervals and at the end."""
        options = self.config.profiler
        summaries = self._windows.summaries if self._windows is not None else None
        distance = options.flag_distance_pct if options.traces == "flagged" else None
        exchange = WindowExchange(self.session, summaries, distance, self._requested_ranks)
        if self.session.stage_clock is not None:
            self.session.stage_clock.train_exchanges.append(exchange)
        return exchange

    def _requested_ranks(self) -> dict[tuple[str, int], list[int]]:
        """The ranks each triggered or requested window was opened for: they keep its trace."""
        plans = self._watch.plans if self._watch is not None else []
        return {("train", plan.window): plan.ranks for plan in plans if plan.window is not None}

    def _reporting_rank(self) -> int:
        return self.session.profiled_ranks[0] if self.session.profiled_ranks else 0

    def _traces_upload_note(self) -> str:
        """Upload traces with the run only when they are small enough; the run folder always keeps them."""
        assert self.session.run_dir is not None
        upload = TracesUpload.of(self.session.run_dir, self.config.profiler)
        if not upload.uploaded:
            traces_dir = self.session.run_dir / TRACES_DIR
            self.session.keep_local(traces_dir)
            log.info(
                "traces (%s) are not uploaded to MLflow (profiler.upload_traces_max_mb=%g); they are in %s",
                format_value(upload.total_mb, "MB"),
                upload.limit_mb,
                traces_dir,
            )
        return upload.note

    def stop_background_work(self) -> None:
        if self._watch is not None:
            self._watch.close()
        for stage in STAGES:
            try:
                self._stop(stage)
            except Exception as error:
                log.warning("stopping the %s profiler failed: %s", stage, error)
        if self._windows is not None:
            self._windows.close()


def _torch_based_profiler(trainer: Any) -> str | None:
    """Name of a Lightning profiler on the trainer that runs torch.profiler itself, if any."""
    profiler = unwrapped(getattr(trainer, "profiler", None))
    name = type(profiler).__name__
    return name if any(cls.__name__ == "PyTorchProfiler" for cls in type(profiler).__mro__) else None


def _planned_train_batches(trainer: Any) -> int | None:
    """Training batches of the fit (optimizer steps times gradient accumulation); None when unknown."""
    try:
        steps = float(trainer.estimated_stepping_batches)
    except Exception:
        return None
    if not math.isfinite(steps):
        return None
    return int(steps) * int(getattr(trainer, "accumulate_grad_batches", 1) or 1)


def _validation_batches(trainer: Any) -> int | None:
    counts = getattr(trainer, "num_val_batches", None)
    if counts is None:
        return None
    total = sum(counts) if isinstance(counts, list | tuple) else counts
    return int(total) if math.isfinite(total) else None
