"""`anemoi-profiler compare A B`: two runs side by side (run folders or MLflow run ids), regressions marked."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..reports.compare import REGRESSION_THRESHOLD_PCT, compare_runs, format_text, render_html
from ..reports.run_data import RunFolderError, load_run, resolve_run

NAME = "compare"
HELP = "two runs side by side, regressions marked"
DESCRIPTION = (
    "Compare run B against baseline A (run folders or MLflow run ids): throughput, step time, "
    "peak memory, top operators; differences are B - A."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", metavar="A", help="baseline: run folder or MLflow run id")
    parser.add_argument("candidate", metavar="B", help="candidate: run folder or MLflow run id")
    parser.add_argument("--html", type=Path, help="also write the comparison as a self-contained HTML page")
    parser.add_argument(
        "--threshold",
        type=float,
        default=REGRESSION_THRESHOLD_PCT,
        help=f"percent change for the worse that counts as a regression (default: {REGRESSION_THRESHOLD_PCT:g})",
    )
    parser.add_argument("--tracking-uri", help="MLflow to download runs from (default: $MLFLOW_TRACKING_URI)")


def run(args: argparse.Namespace) -> int:
    """Print the comparison (and write --html); 0, or 1 after a one-line error."""
    try:
        with tempfile.TemporaryDirectory(prefix="anemoi-profiler-compare-") as downloads:
            a, b = (
                load_run(resolve_run(target, args.tracking_uri, Path(downloads) / side))
                for side, target in (("a", args.baseline), ("b", args.candidate))
            )
            comparison = compare_runs(a, b, args.threshold)
            if args.html:
                args.html.write_text(render_html(comparison), encoding="utf-8")
    except (RunFolderError, OSError) as error:
        print(f"anemoi-profiler compare: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    print(format_text(comparison), end="")
    if args.html:
        print(f"written: {args.html}")
    return 0
