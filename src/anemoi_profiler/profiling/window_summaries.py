"""Each finished window summarised on a thread of its own, from torch's results: the training loop only hands over.

Reading torch's events is Python work proportional to the window's events; done where the window closes it
would stall the next training step, so one background thread does it. The exchange takes the finished ones
at a training interval (`ready`, `take`) and the rest at the session's end (`collect`). A window that cannot
be summarised is left out with one warning; training never sees it.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .kineto_events import reads_in_process, window_events_from_kineto, window_events_from_saved
from .trace_stream import read_window_events
from .window_summary import WindowSummary, summarize

log = logging.getLogger(__name__)

WindowKey = tuple[str, int]
"""(stage, window index)."""


class WindowSummaries:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anemoi-profiler-summary")
        self._pending: dict[WindowKey, Future[WindowSummary]] = {}
        self._warned = False
        self.in_process = reads_in_process()

    def submit(self, stage: str, window: int, results: Any, trace: Future[Path | None] | None = None) -> None:
        """Summarise `results` (torch's `_ProfilerResult` of the window) in the background.

        `trace`: the window's trace file being written (its path, None if it was not), which a torch that
        cannot read the events in process reads instead (kineto saves a window only once).
        """
        if self.in_process:
            future = self._executor.submit(_summarize_in_process, results.kineto_results)
        else:
            future = self._executor.submit(_summarize_saved, results.kineto_results, trace)
        self._pending[(stage, window)] = future

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
            future = self._pending.pop(key)
            try:
                summaries[key] = future.result()
            except Exception as error:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "anemoi-profiler: could not summarise window %s: %s: %s", key, type(error).__name__, error
                    )
        return summaries

    def collect(self) -> dict[WindowKey, WindowSummary]:
        """Every window's summary not yet taken, waiting for those still running."""
        return self.take(list(self._pending))

    def close(self) -> None:
        """Let the summaries under way finish: `collect` may still be called after."""
        self._executor.shutdown(wait=True)


def _summarize_in_process(results: Any) -> WindowSummary:
    return summarize(window_events_from_kineto(results))


def _summarize_saved(results: Any, trace: Future[Path | None] | None) -> WindowSummary:
    if trace is None:  # no trace for the run folder: the summary's save is the window's only one
        return summarize(window_events_from_saved(results))
    path = trace.result()
    if path is None:
        raise RuntimeError("on torch < 2.12 a window is summarised from its trace, which was too large to write")
    return summarize(read_window_events(path))
