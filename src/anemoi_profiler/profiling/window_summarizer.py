"""Each finished window summarised off the training thread and, with a trace, off its GIL: the loop only hands over.

Reading a window's events is Python work proportional to its events; done where the window closes it would
stall the next training step, and in a thread of the training process it holds the GIL that the training thread
waits for. So one background thread hands a window with a trace file to the helper process (`window_helper`),
which reads the trace, and waits for its reply; a window without a trace (`profiler.traces: false`), or one the
helper could not summarise, is read from torch's results on that thread. The exchange takes the finished ones
at a training interval (`ready`, `take`) and the rest at the session's end (`collect`). A window that cannot
be summarised is left out with one warning; training never sees it. The same thread writes the window's
kernel-name table (the names behind the hashes the exchange sends) before the window counts as ready, so the
training thread never writes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from anemoi_profiler.logs import get_logger
from anemoi_profiler.profiling.kineto_events import (
    reads_in_process,
    window_events_from_kineto,
    window_events_from_saved,
)
from anemoi_profiler.profiling.torch_private import kineto_results
from anemoi_profiler.profiling.trace_stream import read_window_events
from anemoi_profiler.profiling.window_helper import HelperError, SummaryHelper
from anemoi_profiler.profiling.window_summary import WindowSummary, summarize

log = get_logger(__name__)

WindowKey = tuple[str, int]
"""(stage, window index)."""


class WindowSummaries:
    def __init__(self, names_path: Callable[[WindowKey], Path] | None = None, helper: bool = True) -> None:
        """`names_path`: where a window's kernel-name table goes (None: not written); `helper`: windows with a
        trace are summarised in the helper process (False: on the summary thread)."""
        self._names_path = names_path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anemoi-profiler-summary")
        self._pending: dict[WindowKey, Future[WindowSummary]] = {}
        self._steps: dict[WindowKey, int | None] = {}
        self._said: set[object] = set()
        self.in_process = reads_in_process()
        self._helper = SummaryHelper() if helper else None
        self._prepared = False

    @property
    def uses_helper(self) -> bool:
        """Windows with a trace file are summarised in the helper process."""
        return self._helper is not None

    def submit(
        self,
        stage: str,
        window: int,
        results: Any,
        trace: Future[Path | None] | None = None,
        step: int | None = None,
        temporary: bool = False,
    ) -> None:
        """Summarise `results` (the window's `torch.profiler.profile(...).profiler`) in the background; `step`:
        the trainer's global step after the window's last batch, kept as the summary's `step`.

        `trace`: the window's trace file being written (its path, None if it was not), which a torch that
        cannot read the events in process reads instead (kineto saves a window only once); `temporary`: the
        trace was exported for the summary alone and is removed once read.
        """
        names_path = self._names_path((stage, window)) if self._names_path is not None else None
        if trace is not None and self._helper is not None:
            future = self._executor.submit(
                self._summarize_in_helper, kineto_results(results), trace, names_path, temporary
            )
        elif self.in_process:
            future = self._executor.submit(_summarize_in_process, kineto_results(results), names_path)
        else:
            future = self._executor.submit(_summarize_saved, kineto_results(results), trace, names_path)
        self._pending[(stage, window)] = future
        self._steps[(stage, window)] = step

    def ready(self) -> list[WindowKey]:
        """Windows whose summary is done (or failed) and not yet taken, without waiting."""
        return [key for key, future in self._pending.items() if future.done()]

    def running(self) -> int:
        """Windows still being summarised."""
        return sum(not future.done() for future in self._pending.values())

    def take(self, keys: list[WindowKey]) -> dict[WindowKey, WindowSummary]:
        """The summaries of `keys` (waiting for any not done), no longer pending; failed ones left out (warned once)."""
        summaries = {}
        for key in keys:
            future, step = self._pending.pop(key), self._steps.pop(key, None)
            try:
                summaries[key] = future.result()
                summaries[key].step = step
            except Exception as error:
                log.warning_once(
                    self._said, "failed", "could not summarise window %s: %s: %s", key, type(error).__name__, error
                )
        return summaries

    def collect(self) -> dict[WindowKey, WindowSummary]:
        """Every window's summary not yet taken, waiting for those still running."""
        return self.take(list(self._pending))

    def close(self) -> None:
        """Let the summaries under way finish, then end the helper: `collect` may still be called after."""
        self._executor.shutdown(wait=True)
        if self._helper is not None:
            self._helper.close()

    def prepare(self) -> None:
        """A window is about to record: start the helper in the background (once), so that its start-up is
        over before the window ends."""
        if self._helper is not None and not self._prepared:
            self._prepared = True
            self._executor.submit(self._start_helper)

    def _start_helper(self) -> None:
        assert self._helper is not None
        try:
            self._helper.start()
        except HelperError as error:  # the first window tries again, and falls back to this thread
            log.warning_once(self._said, "helper", "window summaries are read in the training process: %s", error)

    def _summarize_in_helper(
        self, results: Any, trace: Future[Path | None], names_path: Path | None, temporary: bool
    ) -> WindowSummary:
        """The summary of the window's trace file, made in the helper; where it cannot, on this thread."""
        assert self._helper is not None
        path = trace.result()
        try:
            if path is not None:
                try:
                    return _with_names(self._helper.summarize(path), names_path)
                except HelperError as error:
                    log.warning_once(
                        self._said, "helper", "window summaries are read in the training process: %s", error
                    )
            if self.in_process:
                return _summarize_in_process(results, names_path)
            return _summarize_saved(results, trace, names_path)
        finally:
            if temporary and path is not None:
                path.unlink(missing_ok=True)


def write_kernel_names(path: Path, summary: WindowSummary) -> None:
    """The names behind the hashes of `summary`; if not written, another rank's view shows a kernel as its hash."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary.name_table(), indent=1))
    except OSError as error:
        log.warning("kernel names not written to %s: %s", path, error)


def _summarize_in_process(results: Any, names_path: Path | None) -> WindowSummary:
    return _with_names(summarize(window_events_from_kineto(results)), names_path)


def _summarize_saved(results: Any, trace: Future[Path | None] | None, names_path: Path | None) -> WindowSummary:
    if trace is None:  # no trace for the run folder: the summary's save is the window's only one
        return _with_names(summarize(window_events_from_saved(results)), names_path)
    path = trace.result()
    if path is None:
        raise RuntimeError("on torch < 2.12 a window is summarised from its trace, which was too large to write")
    return _with_names(summarize(read_window_events(path)), names_path)


def _with_names(summary: WindowSummary, names_path: Path | None) -> WindowSummary:
    if names_path is not None:
        write_kernel_names(names_path, summary)
    return summary
