"""The exchange's file work runs off the training thread: the summary thread writes the kernel names, the
exchange's worker reads them and writes the tables; the training thread only joins the gather."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from anemoi_profiler import names
from anemoi_profiler.clock import ExchangeControl, RankTotals
from anemoi_profiler.cluster import window_exchange
from anemoi_profiler.cluster.window_exchange import WindowExchange
from anemoi_profiler.profiling import window_summarizer as window_summaries
from anemoi_profiler.profiling.window_summarizer import WindowSummaries
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.run_files.layout import kernel_names_path, window_summary_path


def _profiled_window() -> Any:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(2):
            with record_function(f"ProfilerStep#{step}"):
                torch.ones(32, 32).matmul(torch.ones(32, 32)).sum()
    return prof.profiler


def _summarised(run_dir: Path, step: int | None = None) -> WindowSummaries:
    summaries = WindowSummaries(lambda key: kernel_names_path(run_dir, *key, 0))
    summaries.submit("train", 0, _profiled_window(), step=step)
    deadline = time.monotonic() + 30
    while not summaries.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    return summaries


def _recording_threads(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, gate: threading.Event) -> list[str]:
    """Wrap the real function `module.name`: note the thread that calls it, hold it until `gate` is set."""
    real, threads = getattr(module, name), []

    def recorded(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        gate.wait(timeout=5)
        return real(*args)

    monkeypatch.setattr(module, name, recorded)
    return threads


def test_the_summary_thread_writes_the_kernel_names_before_the_window_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    gate.set()
    writers = _recording_threads(monkeypatch, window_summaries, "write_kernel_names", gate)
    summaries = _summarised(tmp_path)
    assert summaries.ready() == [("train", 0)]
    assert writers and all(name.startswith("anemoi-profiler-summary") for name in writers)
    summary = summaries.take([("train", 0)])[("train", 0)]
    assert json.loads(kernel_names_path(tmp_path, "train", 0, 0).read_text()) == summary.name_table()


def test_received_returns_before_the_worker_reads_the_names_and_finish_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summaries = _summarised(tmp_path)
    session = ProfilerSession()
    session.run_dir = tmp_path
    exchange = WindowExchange(session, summaries, None, dict)
    gate = threading.Event()
    readers = _recording_threads(monkeypatch, window_exchange, "_read_names", gate)
    control = ExchangeControl()
    exchange.outgoing(control)
    assert control.windows_ready == 1
    exchange.received(
        step=10, ranks=[RankTotals()], controls=[control]
    )  # the training thread: the gather, then it hands over
    assert not window_summary_path(tmp_path, "train", 0, ".csv").exists()  # the worker waits at the gate
    gate.set()
    exchange.finish()
    assert readers and all(name.startswith("anemoi-profiler-exchange") for name in readers)
    assert list(exchange.tables) == [("train", 0)]
    assert window_summary_path(tmp_path, "train", 0, ".csv").is_file()
    assert exchange.tables[("train", 0)].ranks == [0]


@pytest.mark.parametrize(("step", "logged_at"), [(18, 18), (None, 0)])
def test_a_windows_metrics_go_at_its_own_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int | None, logged_at: int
) -> None:
    """A window ending with the batch after which the global step is 18 logs its `window/...` figures at step
    18, not at its index 0 (the index only where no rank knew the step)."""
    session = ProfilerSession()
    session.run_dir = tmp_path
    logged: list[tuple[int | None, list[str]]] = []
    monkeypatch.setattr(session, "log_metrics", lambda metrics, step=None: logged.append((step, list(metrics))))
    exchange = WindowExchange(session, _summarised(tmp_path, step), None, dict)
    exchange.finish()
    assert exchange.tables[("train", 0)].step == step
    assert logged and {at for at, _ in logged} == {logged_at}
    assert all(name.startswith(f"{names.WINDOW}train/") for _, logged_names in logged for name in logged_names)
