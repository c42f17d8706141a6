"""The end-of-run report, rendered from collected values (never from parsed text) to console, TXT and JSON."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anemoi_profiler.run_files.layout import REPORT_JSON, REPORT_TXT

MB = 1e6
"""Decimal megabytes, as MLflow's system metrics count them; every MB the profiler reports is one of these."""
GB = 1e9


@dataclass
class ReportSection:
    """One titled table of the report; `data` is its machine-readable form for report.json."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    data: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @classmethod
    def key_values(cls, title: str, values: dict[str, tuple[Any, str]], note: str = "") -> ReportSection:
        """A two-column section from {label: (value, unit)}."""
        rows = [[label, format_value(value, unit)] for label, (value, unit) in values.items()]
        data = {label: value for label, (value, _unit) in values.items()}
        return cls(title, ["", ""], rows, data, note)


def format_value(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


@dataclass
class RunReport:
    header: dict[str, Any]
    sections: list[ReportSection] = field(default_factory=list)

    def add(self, section: ReportSection | None) -> None:
        if section is not None:
            self.sections.append(section)

    def to_json(self) -> dict[str, Any]:
        return {
            "header": self.header,
            "sections": {
                s.title: {"data": s.data, "columns": s.columns, "rows": s.rows, "note": s.note} for s in self.sections
            },
        }

    def to_text(self) -> str:
        lines = ["anemoi-profiler report", "=" * 22]
        lines += [f"{key}: {value}" for key, value in self.header.items()]
        for section in self.sections:
            lines += ["", section.title, "-" * len(section.title)]
            if section.note:
                lines += [section.note, ""]
            lines += plain_table(section.columns, section.rows)
        return "\n".join(lines) + "\n"

    def write(self, folder: Path, txt: bool = True, as_json: bool = True) -> list[Path]:
        written = []
        if txt:
            written.append(folder / REPORT_TXT)
            written[-1].write_text(self.to_text())
        if as_json:
            written.append(folder / REPORT_JSON)
            written[-1].write_text(json.dumps(self.to_json(), indent=2, default=str))
        return written

    def print_console(self) -> None:
        """Rich tables on a terminal; rich falls back to plain text in log files."""
        from rich.console import Console
        from rich.table import Table

        console = Console(soft_wrap=True)
        if not console.is_terminal and "COLUMNS" not in os.environ:
            # A log file has no width to fit: rich's default of 80 columns would fold the diagnosis lines.
            console = Console(soft_wrap=True, width=LOG_WIDTH)
        console.rule("anemoi-profiler report")
        for key, value in self.header.items():
            console.print(f"[bold]{key}[/bold]: {value}", highlight=False)
        for section in self.sections:
            console.print()
            console.print(section.title, style="bold italic", highlight=False)  # then its note, as in report.txt
            if section.note:
                console.print(section.note, highlight=False)
            if len(section.columns) == 1 and not any(section.columns):
                # Sentences (the diagnosis): one line each, as in report.txt; a table would fold them mid-sentence.
                for row in section.rows:
                    console.print(" ".join(str(cell) for cell in row), soft_wrap=True, markup=False, highlight=False)
                continue
            table = Table(show_header=any(section.columns), box=None)
            for index, column in enumerate(section.columns):
                table.add_column(column, justify="left" if index == 0 else "right", overflow="fold")
            for row in section.rows:
                table.add_row(*(str(cell) for cell in row))
            console.print(table)


LOG_WIDTH = 160


def plain_table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [[str(c) for c in row] for row in rows]
    header = [str(c) for c in columns] if any(columns) else None
    widths = (
        [max(len(r[i]) for r in ([header] if header else []) + cells) for i in range(len(columns))] if cells else []
    )
    lines = []
    if header and widths:
        lines.append(
            "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))
        )
    for row in cells:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return lines
