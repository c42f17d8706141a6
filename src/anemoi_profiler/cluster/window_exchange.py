"""Every rank's window summaries in one fixed-shape all-gather; rank 0 writes the table and the spread metrics.

The exchange happens during the run: at the first training interval after every rank has summarised its
windows (each rank says in the clock's exchange how many it has ready and how many are still being
summarised: `WindowExchange`), and once more at the run's end for what is left (validation windows after the
last training interval, a run without interval metrics). Each rank sends a row of `ROW_LENGTH` float64 per
window (the window's stage, index and step, then the summary with kernel names as hashes; each rank's summary thread
writes its name table in `window_summaries/` before the window is offered), as many rows as the rank with the
most windows ready (padded with NaN), so the gathered table is `world_size x ROW_LENGTH x 8` bytes a window,
whatever the windows held: 8 ranks 5.8 kB, 64 ranks 47 kB, 1,000 ranks 0.73 MB (`exchange_bytes`). Ranks that
did not record a window are left out of its table. The training thread only joins the gather; a worker thread
reads the name tables and writes the table. MLflow gets, per field, the min, median and max over ranks and the
rank of the max (`window/<stage>/<field>_{min,median,max,argmax_rank}`), as each window is exchanged, at the
window's own step: the trainer's global step after its last batch (the window index where no rank knew it).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from anemoi_profiler import names
from anemoi_profiler.clock import ExchangeControl, RankTotals
from anemoi_profiler.cluster.flagged_traces import keeps_trace, settle_held_traces
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.logs import get_logger
from anemoi_profiler.profiling.window_summarizer import WindowKey, WindowSummaries
from anemoi_profiler.profiling.window_summary import FIELD_NAMES, VECTOR_LENGTH, WindowSummary
from anemoi_profiler.profiling.window_table import NOT_ASSESSED, WindowTable
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.run_files.layout import WINDOW_SUMMARIES_DIR, kernel_names_path, window_summary_path

log = get_logger(__name__)

SPREAD_SUFFIXES = ("min", "median", "max", "argmax_rank")
EXCHANGED_STAGES = ("train", "val", "component")
"""A row names its window's stage by its index here."""
ROW_LENGTH = 3 + VECTOR_LENGTH
"""Per window: stage index, window index, global step after its last batch (NaN: unknown), the summary's vector."""


def exchange_bytes(world_size: int, windows: int = 1) -> tuple[int, int]:
    """(bytes each rank sends, bytes of the gathered table every rank receives) for `windows` windows."""
    per_rank = windows * ROW_LENGTH * np.dtype(np.float64).itemsize
    return per_rank, world_size * per_rank


def exchange_summaries(
    exchange: RankExchange, run_dir: Path, mine: dict[WindowKey, WindowSummary], slots: int
) -> dict[WindowKey, WindowTable]:
    """The tables of every window some rank sent (a collective: every rank calls it with the same `slots`, the
    most windows any rank sends, profiled or not); {} on failure."""
    gathered = gather_summaries(exchange, mine, slots)
    return build_tables(run_dir, gathered, slots) if gathered is not None else {}


def gather_summaries(
    exchange: RankExchange, mine: dict[WindowKey, WindowSummary], slots: int
) -> list[list[float]] | None:
    """Every rank's rows (the collective alone: no file is touched); None on failure."""
    payload = np.full((slots, ROW_LENGTH), np.nan)
    for row, ((stage, window), summary) in zip(payload, sorted(mine.items()), strict=False):
        row[:3] = EXCHANGED_STAGES.index(stage), window, math.nan if summary.step is None else summary.step
        row[3:] = summary.vector()
    return exchange.gather(payload.ravel().tolist())


def build_tables(run_dir: Path, gathered: list[list[float]], slots: int) -> dict[WindowKey, WindowTable]:
    """The tables of the gathered rows, with the kernel names each rank's summary thread wrote (on a shared
    file system; a name not found shows as its hash)."""
    rows: dict[WindowKey, dict[int, np.ndarray]] = {}
    steps: dict[WindowKey, list[float]] = {}
    for rank, sent in enumerate(np.array(gathered).reshape(len(gathered), slots, ROW_LENGTH)):
        for row in sent[~np.isnan(sent[:, 0])]:
            key = (EXCHANGED_STAGES[int(row[0])], int(row[1]))
            rows.setdefault(key, {})[rank] = row[3:]
            if not np.isnan(row[2]):
                steps.setdefault(key, []).append(float(row[2]))
    tables = {}
    for (stage, window), by_rank in sorted(rows.items()):
        ranks = sorted(by_rank)
        kernel_names = {}
        for rank in ranks:
            kernel_names.update(_read_names(kernel_names_path(run_dir, stage, window, rank)))
        step = int(max(steps[(stage, window)])) if (stage, window) in steps else None  # the ranks agree
        tables[(stage, window)] = WindowTable(ranks, np.array([by_rank[rank] for rank in ranks]), kernel_names, step)
    return tables


class WindowExchange:
    """One session's window summaries, exchanged at training intervals (a hook of the clock's training exchange)
    and at the end; every rank decides from the same gathered table which of its held traces to keep.

    The training thread only joins the gather; one worker thread, in order, does what follows (read the name
    tables, build the tables, settle held traces, and on rank 0 write the tables and log the spread metrics),
    so the training hot path stays free of that I/O. `finish` waits for the worker.
    """

    def __init__(
        self,
        session: ProfilerSession,
        summaries: WindowSummaries | None,
        flag_distance_pct: float | None,
        requested: Callable[[], Mapping[WindowKey, Collection[int]]],
    ) -> None:
        """`flag_distance_pct` with `profiler.traces: flagged`, else None; `requested`: the ranks each triggered or
        requested window was opened for, which keep its trace."""
        self._session = session
        self._summaries = summaries
        self._flag_distance_pct = flag_distance_pct
        self._requested = requested
        self._offered: list[WindowKey] = []
        self._tables: dict[WindowKey, WindowTable] = {}
        self._tables_lock = threading.Lock()
        self._keep_trace: dict[WindowKey, bool] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anemoi-profiler-exchange")
        self._said: set[object] = set()

    @property
    def tables(self) -> dict[WindowKey, WindowTable]:
        """The tables built so far (every one after `finish`)."""
        with self._tables_lock:
            return dict(self._tables)

    def outgoing(self, control: ExchangeControl) -> None:
        """Say how many windows this rank has summarised (those are offered) and how many are still running."""
        if self._summaries is not None:
            self._offered = self._summaries.ready()
            control.windows_ready = float(len(self._offered))
            control.windows_summarising = float(self._summaries.running())

    def received(self, step: int, ranks: list[RankTotals], controls: list[ExchangeControl]) -> None:
        """Exchange the offered windows once some rank has one and none is still summarising (all ranks decide
        alike from the same gathered messages, so all of them join the gather)."""
        slots = int(max((control.windows_ready for control in controls), default=0))
        if slots and not any(control.windows_summarising for control in controls):
            offered, self._offered = self._offered, []
            with self._session.own_work.measure():
                self._share(self._summaries.take(offered) if self._summaries is not None else {}, slots, final=False)

    def finish(self) -> None:
        """At the session's end, on every rank: exchange what is left, settle every held trace, and wait for the
        worker, so that `tables` is complete."""
        mine = self._summaries.collect() if self._summaries is not None else {}
        counts = self._session.exchange.gather([float(len(mine))])
        slots = int(max(count[0] for count in counts)) if counts else 0
        self._share(mine, slots, final=True)
        self._worker.shutdown(wait=True)

    def _share(self, mine: dict[WindowKey, WindowSummary], slots: int, final: bool) -> None:
        """Join the gather here; hand the rows to the worker."""
        gathered = gather_summaries(self._session.exchange, mine, slots) if slots else None
        requested = self._requested() if self._flag_distance_pct is not None else {}
        self._worker.submit(self._settle, gathered, slots, requested, final)

    def _settle(
        self,
        gathered: list[list[float]] | None,
        slots: int,
        requested: Mapping[WindowKey, Collection[int]],
        final: bool,
    ) -> None:
        """On the worker, after the gather: each rank's own work, so an error here cannot leave another waiting."""
        session = self._session
        try:
            assert session.run_dir is not None
            tables = build_tables(session.run_dir, gathered, slots) if gathered is not None else {}
            with self._tables_lock:
                self._tables.update(tables)
            if self._flag_distance_pct is not None:
                for key, table in tables.items():
                    self._keep_trace[key] = session.global_rank in requested.get(key, ()) or keeps_trace(
                        table, session.global_rank, self._flag_distance_pct
                    )
                settle_held_traces(session.run_dir, session.global_rank, self._keep_trace, final)
            if session.is_global_zero:
                write_tables(session.run_dir, tables)
                for (stage, window), table in tables.items():
                    step = table.step if table.step is not None else window
                    session.log_metrics(spread_metrics(stage, table), step=step)
        except Exception as error:
            log.warning_once(self._said, "failed", "window summaries: %s: %s", type(error).__name__, error)


def write_tables(run_dir: Path, tables: dict[WindowKey, WindowTable]) -> None:
    for (stage, window), table in tables.items():
        window_summary_path(run_dir, stage, window, ".csv").parent.mkdir(parents=True, exist_ok=True)
        window_summary_path(run_dir, stage, window, ".csv").write_text(table.to_csv())
        window_summary_path(run_dir, stage, window, ".json").write_text(json.dumps(table.to_json(), indent=1))


def spread_metrics(stage: str, table: WindowTable) -> dict[str, float]:
    """`window/<stage>/<field>_{min,median,max,argmax_rank}` for every field some rank assessed."""
    metrics = {}
    for field in FIELD_NAMES:
        spread = table.spread(field)
        if spread.argmax_rank < 0:
            continue  # not assessed on any rank (device fields of a CPU-only run)
        values = (spread.min, spread.median, spread.max, float(spread.argmax_rank))
        for suffix, value in zip(SPREAD_SUFFIXES, values, strict=True):
            metrics[names.window_spread(stage, field, suffix)] = value
    return metrics


def window_section(tables: dict[WindowKey, WindowTable]) -> ReportSection | None:
    """The report's view of the tables: per window, the spread of idle and overlap and the rank that stands out."""
    if not tables:
        return None
    rows, data = [], {}
    for (stage, window), table in sorted(tables.items()):
        idle, overlap = table.spread("idle_pct"), table.spread("overlap_pct")
        exposed, host_wait = table.spread("exposed_communication_pct"), table.spread("idle_host_wait_pct")
        top = table.top_kernels(idle.argmax_rank if idle.argmax_rank >= 0 else table.ranks[0])
        rows.append(
            [
                f"{stage}/window_{window}",
                len(table.ranks),
                _pct(idle.median),
                f"{_pct(idle.max)} (rank {idle.argmax_rank})" if idle.argmax_rank >= 0 else NOT_ASSESSED,
                _pct(host_wait.median),
                _pct(overlap.min) if overlap.argmax_rank >= 0 else NOT_ASSESSED,
                f"{_pct(exposed.max)} (rank {exposed.argmax_rank})" if exposed.argmax_rank >= 0 else NOT_ASSESSED,
                str(top[0]["name"])[:60] if top else "",
            ]
        )
        data[f"{stage}/window_{window}"] = table.to_json()["spread"]  # None where not assessed
    columns = ["window", "ranks", "idle % median", "idle % max", "host wait % of idle", "overlap % min",
               "exposed comm % max", "top kernel"]  # fmt: skip
    note = f"Every rank's figures: {WINDOW_SUMMARIES_DIR}/<stage>/window_<k>/ (docs/hta.md)."
    return ReportSection("Window summary", columns, rows, data, note)


def _pct(value: float) -> str:
    return NOT_ASSESSED if value != value else f"{value:.1f}"


def _read_names(path: Path) -> dict[str, str]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
