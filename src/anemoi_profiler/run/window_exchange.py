"""Every rank's window summaries in one fixed-shape all-gather; rank 0 writes the table and the spread metrics.

Each rank sends `VECTOR_LENGTH` float64 per window (kernel names as hashes; each rank writes its own name table
in `window_summaries/`), so the gathered table is `world_size x VECTOR_LENGTH x 8` bytes a window, whatever
the windows held: 8 ranks 5.4 kB, 64 ranks 43 kB, 1,000 ranks 0.67 MB (`exchange_bytes`). Ranks that did not
profile send NaN and are left out of the table. MLflow gets, per field, the min, median and max over ranks and
the rank of the max (`window/<stage>/<field>_{min,median,max,argmax_rank}`, step = window index).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .. import names
from ..layout import WINDOW_SUMMARIES_DIR, kernel_names_path, window_summary_path
from ..profiling.window_summaries import WindowKey
from ..profiling.window_summary import FIELD_NAMES, VECTOR_LENGTH, WindowSummary
from ..profiling.window_table import NOT_ASSESSED, WindowTable
from ..report import ReportSection
from .distributed import RankExchange

SPREAD_SUFFIXES = ("min", "median", "max", "argmax_rank")


def exchange_bytes(world_size: int, windows: int = 1) -> tuple[int, int]:
    """(bytes each rank sends, bytes of the gathered table every rank receives) for `windows` windows."""
    per_rank = windows * VECTOR_LENGTH * np.dtype(np.float64).itemsize
    return per_rank, world_size * per_rank


def exchange_summaries(
    exchange: RankExchange, run_dir: Path, mine: dict[WindowKey, WindowSummary]
) -> dict[WindowKey, WindowTable]:
    """Every window's table of all ranks (a collective: every rank calls it, profiled or not); {} on failure.

    This rank's kernel-name tables are written first, so rank 0 finds them after the gather on a shared file
    system; without one, a kernel of another rank shows as its hash.
    """
    for (stage, window), summary in mine.items():
        path = kernel_names_path(run_dir, stage, window, exchange.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary.name_table(), indent=1))
    keys = sorted({tuple(key) for text in exchange.gather_texts(json.dumps(sorted(mine))) for key in json.loads(text)})
    if not keys:
        return {}
    payload = np.full((len(keys), VECTOR_LENGTH), np.nan)
    for index, key in enumerate(keys):
        if key in mine:
            payload[index] = mine[key].vector()
    gathered = exchange.gather(payload.ravel().tolist())
    if gathered is None:
        return {}
    everyone = np.array(gathered).reshape(len(gathered), len(keys), VECTOR_LENGTH)
    tables = {}
    for index, (stage, window) in enumerate(keys):
        rows = everyone[:, index, :]
        ranks = [rank for rank in range(len(rows)) if not np.isnan(rows[rank]).all()]
        names = {}
        for rank in ranks:
            names.update(_read_names(kernel_names_path(run_dir, stage, window, rank)))
        tables[(stage, window)] = WindowTable(ranks, rows[ranks], names)
    return tables


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
