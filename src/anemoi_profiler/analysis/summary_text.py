"""The console text of an HTA analysis: per window the ranks, idle and overlap per rank, the top kernels, and what
was skipped or failed and why (`anemoi-profiler analyze`, notebooks)."""

from __future__ import annotations

from typing import Any

from anemoi_profiler import names
from anemoi_profiler.analysis.preflight import format_ranks

MAX_RANK_ROWS = 8
MAX_KERNEL_NAME = 90


def format_summary(summary: dict[str, Any]) -> str:
    """Plain text for the console: per window the ranks, idle and overlap per rank, the top kernels,
    and what was skipped or failed and why.

    Args:
        summary: What `analyze()` or `analyze_window()` returned.

    Returns:
        The text, several lines.
    """
    lines = []
    if "windows" in summary:
        lines.append(
            f"HTA analysis of {summary['target']}: {len(summary['windows'])} window(s) "
            f"in {summary['seconds']:.1f} s, results in {summary['out_dir']}"
        )
    for window in summary.get("windows", [summary]):
        lines.extend(_format_window(window))
    return "\n".join(lines)


def _format_window(window: dict[str, Any]) -> list[str]:
    ranks = window["ranks"]
    title = window.get("window") or window["folder"]
    of_world = f" of {window['world_size']}" if window.get("world_size") not in (None, len(ranks)) else ""
    lines = [f"{title}: {'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}{of_world}"]
    lines.extend(_format_rank_table(window["metrics"], ranks))
    kernel_share = {
        key.rsplit("/", 1)[1].removesuffix("_kernel_time_pct"): value
        for key, value in window["metrics"].items()
        if key.startswith(names.hta_all_ranks("")) and key.endswith("_kernel_time_pct")
    }
    if kernel_share:
        shares = ", ".join(f"{kind} {pct:.1f}%" for kind, pct in kernel_share.items())
        lines.append(f"  GPU kernel time (all ranks): {shares}")
    if window["top_kernels"]:
        lines.append("  top kernels (share of GPU kernel time, all ranks):")
        for kernel in window["top_kernels"]:
            name = _shorten(kernel["name"], MAX_KERNEL_NAME)
            share, kind = kernel["pct_of_kernel_time"], kernel["kernel_type"].lower()
            lines.append(f"    {share:5.1f}%  {kind:<13} {name}")
    if window["ran"]:
        lines.append(f"  ran: {', '.join(window['ran'])}")
    lines.extend(f"  skipped {name}: {reason}" for name, reason in window["skipped"].items())
    lines.extend(f"  FAILED {name}: {error}" for name, error in window["failed"].items())
    lines.extend(f"  warning: {warning}" for warning in window["warnings"])
    if window.get("tables"):  # none where nothing ran (a CPU trace): no folder of tables to point at
        lines.append(f"  tables: {window['out_dir']}")
    return lines


_RANK_COLUMNS = {
    "idle_pct": "idle %",
    "compute_pct": "compute %",
    "non_compute_pct": "non-compute %",
    "comm_comp_overlap_pct": "comm/comp overlap %",
    "kernel_launch_delay_median_us": "launch delay p50 us",
}


def _format_rank_table(metrics: dict[str, float], ranks: list[int]) -> list[str]:
    columns = [c for c in _RANK_COLUMNS if any(names.hta_rank(r, c) in metrics for r in ranks)]
    if not columns:
        return []
    widths = [len(_RANK_COLUMNS[c]) for c in columns]
    rows = ["  rank " + " ".join(_RANK_COLUMNS[c] for c in columns)]
    for rank in ranks[:MAX_RANK_ROWS]:
        values = [metrics.get(names.hta_rank(rank, c)) for c in columns]
        cells = ["-" if value is None else f"{value:.1f}" for value in values]
        rows.append(f"  {rank:>4} " + " ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True)))
    if len(ranks) > MAX_RANK_ROWS:
        rows.append(f"  ... {len(ranks) - MAX_RANK_ROWS} more ranks in temporal_breakdown.csv")
        idle = {r: metrics[names.hta_rank(r, "idle_pct")] for r in ranks if names.hta_rank(r, "idle_pct") in metrics}
        if idle:
            busiest, idlest = min(idle, key=idle.__getitem__), max(idle, key=idle.__getitem__)
            rows.append(
                f"  most idle: rank {idlest} ({idle[idlest]:.1f}%), least: rank {busiest} ({idle[busiest]:.1f}%)"
            )
    return rows


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
