"""`report.html`: the whole run on one self-contained page, diagnosis first.

One file that opens anywhere, offline, and can be mailed or attached to an issue: inline CSS, plots as
embedded SVG images (the very files of `plots/*.svg`, each its own document so its ids and styles never meet
the page's), no script, nothing fetched from the network. Names come from the user's model and traces
(modules, operators, kernels) and are HTML-escaped like every other value on the page.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.report_sections import format_value
from anemoi_profiler.reports.description import key_figures
from anemoi_profiler.reports.diagnosis import TITLE as DIAGNOSIS_TITLE
from anemoi_profiler.reports.diagnosis import NotAssessed, Outcome, fired
from anemoi_profiler.reports.plots import plot_svgs, write_plot_files
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.reports.steady import LABEL
from anemoi_profiler.run_files.layout import REPORT_HTML

MAX_NAME = 120
"""Characters of an operator or kernel name shown in a table cell."""
_HTA_RANK_COLUMNS = {
    "idle_pct": "idle %",
    "idle_host_wait_share_pct": "host wait, % of idle",
    "compute_pct": "compute %",
    "non_compute_pct": "non-compute %",
    "comm_comp_overlap_pct": "comm/comp overlap %",
    "kernel_launch_delay_median_us": "launch delay p50 us",
}
CSS = """
:root { --fg: #1d2129; --muted: #5f6b7a; --line: #d9dee5; --bg: #f6f8fa; --high: #c0392b; --medium: #b9770e;
  --info: #2471a3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
main { max-width: 1180px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid
  var(--line); padding-bottom: 4px; } h3 { font-size: 15px; margin: 18px 0 6px; }
nav a { margin-right: 14px; color: var(--info); text-decoration: none; }
.muted, .note { color: var(--muted); } .note { margin: 4px 0 8px; white-space: pre-line; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; vertical-align: top; }
th:first-child, td:first-child { text-align: left; } th { background: var(--bg); }
td.name { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; max-width: 560px; }
dl.header { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0; }
dl.header dt { color: var(--muted); } dl.header dd { margin: 0; }
.verdict { border-left: 5px solid var(--info); background: var(--bg); padding: 8px 12px; margin: 8px 0; }
.verdict.high { border-color: var(--high); } .verdict.medium { border-color: var(--medium); }
.verdict .tag { font-weight: 600; text-transform: uppercase; font-size: 12px; margin-right: 6px; }
.verdict.high .tag { color: var(--high); } .verdict.medium .tag { color: var(--medium); }
.verdict.info .tag { color: var(--info); } .verdict p { margin: 4px 0; }
.tiles { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0; }
.tile { background: var(--bg); padding: 8px 14px; min-width: 150px; border-radius: 4px; }
.tile b { display: block; font-size: 20px; } .tile span { color: var(--muted); font-size: 12px; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 12px; }
.plots figure { margin: 0; } .plots img { width: 100%; height: auto; }
pre { background: var(--bg); padding: 10px; overflow-x: auto; font-size: 12px; }
tr.regression td { background: #fdecea; } tr.worse td { background: #fdf6e3; }
tr.improvement td { background: #eaf7ee; }
"""


def write_html_report(run: RunData, outcomes: dict[str, Outcome]) -> Path:
    """Write `<run folder>/report.html` and the plots it shows, `plots/*.svg`, for a loaded run and its
    diagnosis (`diagnosis.assess`); return the page's path."""
    svgs = plot_svgs(run)
    path = run.folder / REPORT_HTML
    path.write_text(render_html(run, outcomes, svgs), encoding="utf-8")
    write_plot_files(run.folder, svgs)
    return path


def render_html(run: RunData, outcomes: dict[str, Outcome], svgs: dict[str, str] | None = None) -> str:
    """The page; `svgs` are the run's plots (see `plots.plot_svgs`), drawn now if not given."""
    parts = {
        "diagnosis": _diagnosis(outcomes),
        "plots": _plots(plot_svgs(run) if svgs is None else svgs),
        "operators": _operators(run),
        "model": _model_summary(run),
        "hta": _hta(run),
        "tables": _report_tables(run),
    }
    titles = {"diagnosis": "Diagnosis", "plots": "Plots", "operators": "Operators", "model": "Model", "hta": "HTA"}
    titles["tables"] = "All tables"
    nav = "".join(f'<a href="#{key}">{titles[key]}</a>' for key, body in parts.items() if body)
    body = (
        f"<h1>{esc(run.title)}</h1><p class='muted'>anemoi-profiler report</p>"
        + definition_list(run.describe())
        + f"<nav>{nav}</nav>"
        + _key_numbers(run)
        + "".join(f'<section id="{key}">{content}</section>' for key, content in parts.items() if content)
    )
    return html_page(f"{run.title}: anemoi-profiler report", body)


# ---- building blocks, shared with `compare` ----
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def html_page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><main>{body}</main></body></html>\n"
    )


def html_table(
    columns: Iterable[Any], rows: Iterable[Iterable[Any]], name_column: bool = False, row_classes: Iterable[str] = ()
) -> str:
    """A table; `name_column` sets the first column in monospace for operator and kernel names."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    classes = list(row_classes)
    lines = []
    for index, row in enumerate(rows):
        cells = [_name_cell(str(c)) if i == 0 and name_column else f"<td>{esc(c)}</td>" for i, c in enumerate(row)]
        row_class = f' class="{esc(classes[index])}"' if index < len(classes) and classes[index] else ""
        lines.append(f"<tr{row_class}>{''.join(cells)}</tr>")
    thead = f"<thead><tr>{head}</tr></thead>" if any(str(c) for c in columns) else ""
    return f"<table>{thead}<tbody>{''.join(lines)}</tbody></table>"


def _name_cell(name: str) -> str:
    """Kernel names run to hundreds of characters of C++ templates: shortened, the whole name on hover."""
    if len(name) <= MAX_NAME:
        return f"<td class='name'>{esc(name)}</td>"
    return f"<td class='name' title='{esc(name)}'>{esc(name[: MAX_NAME - 1])}…</td>"


def definition_list(values: dict[str, Any]) -> str:
    items = "".join(f"<dt>{esc(key)}</dt><dd>{esc(value)}</dd>" for key, value in values.items())
    return f"<dl class='header'>{items}</dl>"


# ---- parts ----
def _diagnosis(outcomes: dict[str, Outcome]) -> str:
    cards = "".join(
        f"<div class='verdict {esc(v.severity)}'><p><span class='tag'>{esc(v.severity)}</span>"
        f"<b>{esc(v.name)}</b>: {esc(v.value)}</p><p>{esc(v.message)}</p>"
        f"<p><b>Next:</b> {esc(v.next_step)}</p></div>"
        for v in fired(outcomes)
    )
    not_assessed = "; ".join(f"{name} ({o.reason})" for name, o in outcomes.items() if isinstance(o, NotAssessed))
    note = f"<p class='note'>Not assessed: {esc(not_assessed)}.</p>" if not_assessed else ""
    return f"<h2>{DIAGNOSIS_TITLE}</h2>{cards or '<p>No limiter found.</p>'}{note}"


def _key_numbers(run: RunData) -> str:
    tiles = [f"<div class='tile'><b>{esc(v)}</b><span>{esc(k)}</span></div>" for k, v in key_figures(run).items()]
    note = f"<p class='note'>Rates and times: {esc(LABEL)} (report.txt and All tables say how).</p>"
    return f"<div class='tiles'>{''.join(tiles)}</div>{note}" if tiles else ""


def _plots(svgs: dict[str, str]) -> str:
    plots = "".join(
        f"<figure>{svg_image(svg, f'{name} plot'.replace('_', ' '))}</figure>" for name, svg in svgs.items()
    )
    return f"<h2>Plots</h2><div class='plots'>{plots}</div>" if plots else ""


def svg_image(svg: str, alt: str) -> str:
    """An `<img>` of an SVG document, embedded: its own document, so nothing in it meets the page's CSS or ids."""
    return f"<img alt='{esc(alt)}' src='data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode('ascii')}'>"


def _operators(run: RunData) -> str:
    """The report's operator tables (time, then memory with its explanation); the per-window files otherwise."""
    sections = run.operator_sections()
    if sections:
        tables = [(title, s["columns"], s["rows"], title.startswith("Memory")) for title, s in sections]
    else:
        tables = _window_tables(run)
    if not tables:
        return ""
    time_html = "".join(_titled_table(t, c, r) for t, c, r, memory in tables if not memory)
    memory_html = "".join(_titled_table(t, c, r) for t, c, r, memory in tables if memory)
    explanation = _explanation(str(run.memory_report.get("explanation") or ""))
    explained = f"<h3>Memory by operator</h3>{explanation}{memory_html}" if memory_html else ""
    return f"<h2>Top operators</h2>{time_html}{explained}"


def _window_tables(run: RunData) -> list[tuple[str, list[str], list[list[Any]], bool]]:
    tables = []
    for report, memory in (("time", False), ("memory", True)):
        for stage in ("train", "val"):
            for window in run.operator_windows(stage, report):
                operators = window.get("operators") or []
                if operators:
                    title = f"{'Memory' if memory else 'Time'} by operator ({stage} window {window.get('window')})"
                    columns = list(operators[0])
                    rows = [[_cell(op.get(c)) for c in columns] for op in operators]
                    tables.append((title, columns, rows, memory))
    return tables


def _model_summary(run: RunData) -> str:
    if not run.model_summary:
        return ""
    return f"<h2>Model summary</h2><pre>{esc(run.model_summary)}</pre>"


def _hta(run: RunData) -> str:
    summary = run.hta
    if not summary:
        return ""
    parts = ["<h2>Holistic Trace Analysis</h2>"]
    if "all" in (summary.get("skipped") or {}):
        parts.append(f"<p>Skipped: {esc(summary['skipped']['all'])}</p>")
    for window in summary.get("windows") or []:
        parts.append(_hta_window(window))
    return "".join(parts)


def _hta_window(window: dict[str, Any]) -> str:
    ranks = window.get("ranks") or []
    metrics = window.get("metrics") or {}
    parts = [f"<h3>{esc(window.get('window') or window.get('folder', ''))}</h3>"]
    columns = [c for c in _HTA_RANK_COLUMNS if any(names.hta_rank(r, c) in metrics for r in ranks)]
    if columns:
        rows = [[r, *(_cell(metrics.get(names.hta_rank(r, c))) for c in columns)] for r in ranks]
        parts.append(html_table(["rank", *(_HTA_RANK_COLUMNS[c] for c in columns)], rows))
    shares = {
        key.rsplit("/", 1)[1].removesuffix("_kernel_time_pct"): value
        for key, value in metrics.items()
        if key.startswith(names.hta_all_ranks("")) and key.endswith("_kernel_time_pct")
    }
    if shares:
        text = ", ".join(f"{kind} {float(pct):.1f}%" for kind, pct in shares.items())
        parts.append(f"<p>GPU kernel time (all ranks): {esc(text)}</p>")
    kernels = window.get("top_kernels") or []
    if kernels:
        rows = [[k.get("name"), k.get("kernel_type"), _cell(k.get("pct_of_kernel_time"))] for k in kernels]
        parts.append(html_table(["top kernel", "type", "% of kernel time"], rows, name_column=True))
    facts = [("ran", ", ".join(window.get("ran") or []) or "nothing")]
    facts += [(f"skipped {name}", reason) for name, reason in (window.get("skipped") or {}).items()]
    facts += [(f"failed {name}", error) for name, error in (window.get("failed") or {}).items()]
    facts += [("warning", warning) for warning in window.get("warnings") or []]
    parts.append(html_table(["", ""], facts))
    return "".join(parts)


def _report_tables(run: RunData) -> str:
    """Every other section of report.json, as the console shows it."""
    shown = {DIAGNOSIS_TITLE, *(title for title, _ in run.operator_sections())}
    blocks = []
    for title, section in run.sections.items():
        if title in shown:
            continue
        note = f"<p class='note'>{esc(section.get('note'))}</p>" if section.get("note") else ""
        table = html_table(section.get("columns") or [], section.get("rows") or [])
        blocks.append(f"<h3>{esc(title)}</h3>{note}{table}")
    return f"<h2>All tables</h2>{''.join(blocks)}" if blocks else ""


def _titled_table(title: str, columns: list[Any], rows: list[list[Any]]) -> str:
    return f"<h3>{esc(title)}</h3>{html_table(columns, rows, name_column=True)}"


def _explanation(text: str) -> str:
    """memory_report.json's explanation, how to read the memory tables: its '- ' items as a list (continuation
    lines joined); nothing for a run without one."""
    lines = text.splitlines()
    if not lines:
        return ""
    items: list[str] = []
    for line in lines[1:]:
        if line.startswith("- "):
            items.append(line[2:])
        elif items:
            items[-1] += " " + line.strip()
    return f"<p class='note'>{esc(lines[0])}</p><ul class='note'>{''.join(f'<li>{esc(i)}</li>' for i in items)}</ul>"


def _cell(value: Any) -> str:
    """Numbers as the text report writes them; anything else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_value(float(value))
    return "" if value is None else str(value)
