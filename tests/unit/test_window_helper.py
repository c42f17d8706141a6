"""The window summary's helper process: the figures of the in-process read, errors named, and no process left."""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from anemoi_profiler.profiling.trace_stream import read_window_events
from anemoi_profiler.profiling.window_helper import HelperError, SummaryHelper
from anemoi_profiler.profiling.window_summarizer import WindowSummaries
from anemoi_profiler.profiling.window_summary import summarize
from anemoi_profiler.run_files.layout import kernel_names_path


def test_the_helper_gives_the_in_process_figures_names_errors_and_ends(fixtures_dir: Path, tmp_path: Path) -> None:
    trace = fixtures_dir / "traces" / "h200_single_gpu" / "rank-0.pt.trace.json.gz"
    held = tmp_path / "rank0.pt.trace.json.gz.held"  # a held trace of `profiler.traces: flagged`
    shutil.copyfile(trace, held)
    expected = summarize(read_window_events(trace))
    helper = SummaryHelper()
    try:
        np.testing.assert_array_equal(helper.summarize(trace).vector(), expected.vector())
        process = helper._process
        assert process is not None and process.poll() is None
        with pytest.raises(HelperError, match=r"missing\.json"):
            helper.summarize(tmp_path / "missing.json")
        summary = helper.summarize(held)  # the same helper goes on after an error
        assert helper._process is process
        np.testing.assert_array_equal(summary.vector(), expected.vector())
        assert summary.name_table() == expected.name_table()
    finally:
        helper.close()
    assert process.poll() == 0  # it ended when its input closed


class _NoResults:
    kineto_results = None  # reading torch's events would fail: the summary must come from the trace


def test_a_window_with_a_trace_is_summarised_from_its_file(fixtures_dir: Path, tmp_path: Path) -> None:
    trace = fixtures_dir / "traces" / "cpu_only" / "rank-34.pt.trace.json.gz"
    written: Future[Path | None] = Future()
    written.set_result(trace)
    summaries = WindowSummaries(lambda key: kernel_names_path(tmp_path, *key, 0))
    summaries.submit("train", 0, _NoResults(), written, step=7)
    summaries.close()
    (summary,) = summaries.collect().values()
    np.testing.assert_array_equal(summary.vector(), summarize(read_window_events(trace)).vector())
    assert summary.step == 7
    assert kernel_names_path(tmp_path, "train", 0, 0).is_file()
