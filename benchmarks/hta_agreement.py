"""Our window summary of a trace folder beside HTA's figures for the same traces, field by field.

    python benchmarks/hta_agreement.py TRACE_FOLDER [--json OUT.json]

The fields both compute (tests/unit/test_window_summary_hta.py asserts them on the shared fixtures): the temporal
breakdown (idle, compute, non-compute % of the device span), the idle time breakdown (host wait, kernel wait,
other, in points of the span), the communication/computation overlap and the top kernels' total times. Prints
one line per rank and field with both values and the difference in percentage points; also the time and peak
RSS growth of `summarize` and of HTA's parse. Needs HTA (`import hta`: traceinsight or HolisticTraceAnalysis).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from anemoi_profiler.cli.summarize_command import summarize_folder


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def compare(folder: Path) -> dict[str, Any]:
    from hta.configs.env_options import HTAEnvOptions
    from hta.trace_analysis import TraceAnalysis

    rss = peak_rss_mb()
    started = time.perf_counter()
    table = summarize_folder(folder)
    ours_cost = {"seconds": time.perf_counter() - started, "peak_rss_growth_mb": peak_rss_mb() - rss}
    HTAEnvOptions.instance().set_disable_ns_rounding(True)  # the same intervals as ours (docs/hta.md)
    rss = peak_rss_mb()
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    hta_cost = {"seconds": time.perf_counter() - started, "peak_rss_growth_mb": peak_rss_mb() - rss}

    def ours(field: str, rank: int) -> float:
        return float(table.column(field)[table.ranks.index(rank)])

    rows: list[dict[str, Any]] = []

    def row(rank: int, field: str, our: float, hta: float) -> None:
        rows.append({"rank": rank, "field": field, "ours": our, "hta": hta, "difference_pp": our - hta})

    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    _, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    for rank in table.ranks:
        span_us = ours("device_span_ms", rank) * 1e3
        for field, column in (
            ("idle_pct", "idle_time_pctg"),
            ("compute_pct", "compute_time_pctg"),
            ("non_compute_pct", "non_compute_time_pctg"),
        ):
            row(rank, field, ours(field, rank), float(temporal.loc[rank, column]))
        idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
        for category in ("host_wait", "kernel_wait", "other"):
            hta_us = idle[idle["idle_category"] == category]["idle_time"].sum()
            our_us = ours(f"idle_{category}_ms", rank) * 1e3
            row(rank, f"idle_{category} (% of span)", our_us / span_us * 100, float(hta_us) / span_us * 100)
        if ours("communication_ms", rank) > 0:
            row(rank, "overlap_pct", ours("overlap_pct", rank), float(overlap.loc[rank, "comp_comm_overlap_pctg"]))
        hta_kernels = kernels[kernels["rank"] == rank].set_index("name")["sum (us)"]
        for kernel in table.top_kernels(rank):
            if kernel["name"] in hta_kernels.index:
                row(
                    rank,
                    f"kernel {kernel['name'][:60]} (% of span)",
                    float(kernel["total_ms"]) * 1e3 / span_us * 100,
                    float(hta_kernels.loc[kernel["name"]]) / span_us * 100,
                )
    worst = max((abs(r["difference_pp"]) for r in rows), default=0.0)
    return {
        "folder": str(folder),
        "ranks": table.ranks,
        "rows": rows,
        "worst_difference_pp": worst,
        "summarize": ours_cost,
        "hta": hta_cost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args()
    result = compare(args.folder)
    for r in result["rows"]:
        print(
            f"rank {r['rank']:>3}  {r['field']:<72} ours {r['ours']:8.2f}  HTA {r['hta']:8.2f}  "
            f"diff {r['difference_pp']:+6.2f} pp"
        )
    print(
        f"worst difference: {result['worst_difference_pp']:.2f} pp; summarize {result['summarize']}, "
        f"HTA {result['hta']}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
