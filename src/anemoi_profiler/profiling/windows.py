"""The profiling windows of one rank: recorders per stage run, and what each finished window leaves behind.

Each window becomes a trace file, a fixed-size summary (`window_summaries`, on a thread of its own), the
operator rows of its `key_averages()`, and, on CUDA, per-step memory readings and (once) the memory timeline.
The Lightning callback and component profiling both drive this.

The operator rows are built when the reports ask for them, after training: `key_averages()` first turns
every recorded event into a Python object, seconds of interpreter time for a large window, which would
stall the training loop where the window closes. Until then a window keeps only torch's raw results, for the
first `MAX_TABLED_WINDOWS` windows: later ones get no operator rows (their traces have every operator), so
that neither a parse on the training thread nor the raw results of every window are the price of many.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from anemoi_profiler.config_sections import TorchProfilerConfig
from anemoi_profiler.profiling.device_memory import StepMemory, export_memory_timeline
from anemoi_profiler.profiling.durations import DurationStats
from anemoi_profiler.profiling.op_tables import WindowOperators, operator_stats
from anemoi_profiler.profiling.schedule import WindowSchedule
from anemoi_profiler.profiling.stage_profile import WindowRecorder, effective_options, uses_cuda
from anemoi_profiler.profiling.torch_private import cycles_share_one_profiler, window_key_averages
from anemoi_profiler.profiling.traces import TraceWriter, rank_info
from anemoi_profiler.profiling.window_summarizer import WindowSummaries
from anemoi_profiler.run_files.layout import kernel_names_path, timeline_path

MAX_TABLED_WINDOWS = 8
"""Windows of a rank that get operator rows (time and memory reports); torch's raw results are kept until the
fit's end for these only."""


class ProfilingWindows:
    """Opens a recorder per stage run and keeps what the finished windows of this rank produced."""

    def __init__(
        self, run_dir: Path, rank: int, world_size: int, options: TorchProfilerConfig, device: torch.device
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.device = device
        self.options = effective_options(options, device)
        self.rank_info = rank_info(rank, world_size)
        self.traces = TraceWriter(run_dir, rank, world_size, self.options) if self.options.traces else None
        self.step_memory = StepMemory(device) if uses_cuda(device) else None
        self.summaries = (
            WindowSummaries(lambda key: kernel_names_path(run_dir, *key, rank)) if self.options.window_summary else None
        )
        self.durations = DurationStats()
        self._tables: list[WindowOperators] = []
        # (stage, window, steps, torch's results, on torch 2.4 the window's events among them: first, end)
        self._unparsed: list[tuple[str, int, int, Any, tuple[int, int] | None]] = []
        self._events_before: dict[int, int] = {}  # on torch 2.4: events an object held before its latest window
        self.without_operator_rows: list[tuple[str, int]] = []
        """Finished windows past `MAX_TABLED_WINDOWS`: no operator rows."""
        self.completed: Counter[str] = Counter()
        self.timeline_path = timeline_path(run_dir, rank)
        self.timeline_seconds: float | None = None
        self._timeline_tried = False
        self._active: dict[str, int] = {}
        self.closed: list[tuple[str, int]] = []  # (stage, window) of every finished window, in order
        self.end_held_s: dict[tuple[str, int], float] = {}
        """Per finished window: how long its end held the training thread (`note_end_held`)."""
        self._step: int | None = None  # the trainer's global step at the latest batch end

    def open(self, stage: str, schedule: WindowSchedule, batch: int) -> WindowRecorder:
        """Start a recorder for a stage run at its first scheduled batch."""
        self._active[stage] = schedule.active
        recorder = WindowRecorder(stage, schedule, self.options, self.device, self.rank_info, self._on_window)
        recorder.start(batch)
        if self.summaries is not None:
            self.summaries.prepare()
        if self.step_memory is not None and recorder.recording:
            self.step_memory.start_step()
        return recorder

    def number_next_window(self, stage: str, window: int) -> None:
        """Number the stage's next window `window`: triggered windows that this rank does not record still
        take their number, so `window_<k>` is the same window on every rank."""
        self.completed[stage] = window

    def batch_starting(self, stage: str, schedule: WindowSchedule, batch: int) -> None:
        """Warn before a window whose trace will be over the budget (judged from the previous one)."""
        if self.traces is not None and schedule.starts_cycle(batch):
            self.traces.check_next_window(stage, schedule.active)

    def batch_ended(self, recorder: WindowRecorder, batch: int, step: int | None = None) -> None:
        """After `batch` of the recorder's stage; `step`: the trainer's global step then, a window's own step
        when the batch ends it."""
        self._step = step
        memory = self.step_memory
        if memory is not None and recorder.recording:
            memory.end_step(recorder.stage, self.completed[recorder.stage], batch)
        recorder.step()
        if memory is not None and recorder.recording:
            memory.start_step()

    def _on_window(self, prof: Any, stage: str, steps: int) -> None:
        window = self.completed[stage]
        self.completed[stage] += 1
        self.closed.append((stage, window))
        trace = None if self.traces is None else self.traces.write(prof, stage, window, steps, self._active[stage])
        if self.summaries is not None:
            if trace is None and self.summaries.uses_helper:  # traces off: one export, read by the helper
                self.summaries.submit(stage, window, prof.profiler, _exported(prof), step=self._step, temporary=True)
            else:
                self.summaries.submit(stage, window, prof.profiler, trace, step=self._step)
        if self.options.time_report or self.options.memory_report:
            events = None
            if cycles_share_one_profiler():  # torch 2.4 parsed the window's events at its end: counting is free
                end = len(prof.profiler.function_events)
                events = (self._events_before.get(id(prof.profiler), 0), end)
                self._events_before[id(prof.profiler)] = end
            if len(self._unparsed) + len(self._tables) < MAX_TABLED_WINDOWS:
                self._unparsed.append((stage, window, steps, prof.profiler, events))
            else:
                self.without_operator_rows.append((stage, window))
        if self.options.memory_timeline and self.step_memory is not None and not self._timeline_tried:
            self._timeline_tried = True
            self.timeline_seconds = export_memory_timeline(prof, self.timeline_path, self.device)

    def note_end_held(self, closed_before: int, seconds: float) -> list[tuple[str, int]]:
        """The windows that finished since `closed_before` (a length of `closed`) held the training thread
        `seconds` at their end; returns them."""
        ended = self.closed[closed_before:]
        for key in ended:
            self.end_held_s[key] = seconds
        return ended

    @property
    def operator_tables(self) -> list[WindowOperators]:
        """The operator rows of every finished window (parsed now if not yet)."""
        while self._unparsed:
            self._parse_oldest()
        return self._tables

    def _parse_oldest(self) -> None:
        stage, window, steps, results, events = self._unparsed.pop(0)
        averages = window_key_averages(results, events)
        self._tables.append(WindowOperators(stage, window, steps, operator_stats(averages)))

    def flush(self) -> None:
        if self.traces is not None:
            self.traces.flush()

    def close(self) -> None:
        if self.traces is not None:
            self.traces.close()
        if self.summaries is not None:
            self.summaries.close()


def _exported(prof: Any) -> Future[Path | None]:
    """The window exported to a temporary Chrome trace for the summary's helper alone (it removes it)."""
    handle, name = tempfile.mkstemp(prefix="anemoi-profiler-window-", suffix=".json")
    os.close(handle)
    exported: Future[Path | None] = Future()
    try:
        prof.export_chrome_trace(name)
    except Exception:
        os.unlink(name)
        raise
    exported.set_result(Path(name))
    return exported
