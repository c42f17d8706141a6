"""Every rank's window summary in one table: the exchanged vectors, their spread across ranks, CSV, JSON and text.

Rows are ranks, columns the summary's fields (`window_summary.FIELDS`), then the top kernels by name hash and
the rule counts; the name table turns hashes back into kernel names. Torch-free, so `summarize` and the
in-process exchange write the same files.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import numpy as np

from anemoi_profiler.profiling.window_summary import (
    FIELD_NAMES,
    FIELDS,
    RULE_FIELDS,
    TOP_FIELDS,
    TOP_KERNELS,
    VECTOR_LENGTH,
    WindowSummary,
)

TOP_COLUMNS = tuple(f"top{slot + 1}_{part}" for slot in range(TOP_KERNELS) for part in TOP_FIELDS)
COLUMNS = (*FIELD_NAMES, *TOP_COLUMNS, *RULE_FIELDS)
NOT_ASSESSED = "not assessed"


@dataclass(frozen=True)
class Spread:
    """One field across ranks: NaN (not assessed) ranks left out; `argmax_rank` -1 when no rank assessed it."""

    min: float
    median: float
    max: float
    argmax_rank: int


@dataclass
class WindowTable:
    ranks: list[int]
    vectors: np.ndarray
    names: dict[str, str]
    """Kernel name hash (as `f"{hash:.0f}"`) -> name."""
    step: int | None = None
    """The trainer's global step after the window's last batch, its figures' MLflow step; None: unknown."""

    @classmethod
    def of(cls, summaries: dict[int, WindowSummary]) -> WindowTable:
        ranks = sorted(summaries)
        vectors = np.array([summaries[rank].vector() for rank in ranks]).reshape(len(ranks), VECTOR_LENGTH)
        names: dict[str, str] = {}
        for summary in summaries.values():
            names.update(summary.name_table())
        return cls(ranks, vectors, names)

    def column(self, field: str) -> np.ndarray:
        return self.vectors[:, COLUMNS.index(field)]

    def spread(self, field: str) -> Spread:
        values = self.column(field)
        assessed = ~np.isnan(values)
        if not assessed.any():
            return Spread(math.nan, math.nan, math.nan, -1)
        kept = values[assessed]
        argmax = self.ranks[int(np.flatnonzero(assessed)[int(np.argmax(kept))])]
        return Spread(float(kept.min()), float(np.median(kept)), float(kept.max()), argmax)

    def top_kernels(self, rank: int) -> list[dict[str, float | str]]:
        row = self.vectors[self.ranks.index(rank)]
        kernels = []
        for slot in range(TOP_KERNELS):
            at = len(FIELDS) + slot * len(TOP_FIELDS)
            hashed, count, total_ms, share_pct = row[at : at + len(TOP_FIELDS)]
            if not math.isnan(hashed):
                name = self.names.get(f"{hashed:.0f}", f"#{hashed:.0f}")
                kernels.append({"name": name, "count": int(count), "total_ms": total_ms, "share_pct": share_pct})
        return kernels

    def to_json(self) -> dict:
        """Per rank: the fields (None = not assessed), its top kernels by name and the rule counts."""

        def value(number: float) -> float | None:
            return None if math.isnan(number) else round(float(number), 6)

        ranks = []
        for index, rank in enumerate(self.ranks):
            row = self.vectors[index]
            ranks.append(
                {
                    "rank": rank,
                    **{name: value(row[i]) for i, name in enumerate(FIELD_NAMES)},
                    "top_kernels": self.top_kernels(rank),
                    "rules": {name: int(row[COLUMNS.index(name)]) for name in RULE_FIELDS},
                }
            )
        spreads = {name: vars(self.spread(name)) for name in FIELD_NAMES}
        return {"ranks": ranks, "spread": {k: {m: value(v) for m, v in s.items()} for k, s in spreads.items()}}

    def to_csv(self) -> str:
        """One row per rank, every column, kernel names as hashes (the JSON has the names); empty = not assessed."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(("rank", *COLUMNS))
        for rank, row in zip(self.ranks, self.vectors, strict=True):
            writer.writerow((rank, *map(_csv_cell, row)))
        return out.getvalue()

    def format_text(self, max_rank_columns: int = 8) -> str:
        """The fields as rows; one column per rank up to `max_rank_columns` ranks, else min/median/max/argmax."""
        per_rank = len(self.ranks) <= max_rank_columns
        header = [f"rank {rank}" for rank in self.ranks] if per_rank else ["min", "median", "max", "argmax rank"]
        rows = [["field", *header]]
        for name in FIELD_NAMES:
            if per_rank:
                cells = [_cell(value) for value in self.column(name)]
            else:
                spread = self.spread(name)
                cells = [*map(_cell, (spread.min, spread.median, spread.max)), str(spread.argmax_rank)]
            rows.append([name, *cells])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
        for rank in self.ranks[: 1 if not per_rank else len(self.ranks)]:
            lines.append(f"\ntop kernels, rank {rank} (count, total ms, % of device time):")
            for kernel in self.top_kernels(rank):
                lines.append(
                    f"  {kernel['count']:>6}  {kernel['total_ms']:>10.3f}  {kernel['share_pct']:>5.1f}%  "
                    f"{str(kernel['name'])[:100]}"
                )
        return "\n".join(lines)


def _csv_cell(value: float) -> str:
    """Empty when not assessed; name hashes (48-bit integers) in full."""
    return "" if math.isnan(value) else f"{value:.0f}" if abs(value) >= 1e12 else f"{value:.6g}"


def _cell(value: float) -> str:
    return NOT_ASSESSED if math.isnan(value) else f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
