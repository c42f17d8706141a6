"""`anemoi-profiler compare A B`: two runs side by side (run folders or MLflow run ids), regressions marked;
with `--fail-if-slower 5%`, a regression gate for CI (see `reports/regression_gate.py` for the exit codes)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from anemoi_profiler.reports.compare import (
    REGRESSION_THRESHOLD_PCT,
    GateFailed,
    compare_runs,
    format_text,
    render_html,
)
from anemoi_profiler.reports.gate import DRIFT_FLOOR_PCT, GateError
from anemoi_profiler.reports.regression_gate import (
    METRICS,
    GateInputError,
    GateVerdict,
    as_json,
    run_gate,
    verdict_html,
    verdict_lines,
)
from anemoi_profiler.reports.run_data import RunData, RunFolderError, load_run
from anemoi_profiler.reports.window_evidence import why_lines
from anemoi_profiler.tracking.run_download import RunDownloadError, resolve_run

NAME = "compare"
HELP = "two runs side by side, regressions marked; a regression gate with --fail-if-slower"
DESCRIPTION = (
    "Compare run B against baseline A (run folders or MLflow run ids; several runs per side separated by commas): "
    "throughput, step time, peak memory, top operators; differences are B - A. With --fail-if-slower, a gate: "
    "exit 0 not slower, 1 slower (or more memory), 3 inconclusive, 4 not comparable, 2 usage errors."
)
USAGE_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", metavar="A", help="baseline: run folder(s) or MLflow run id(s), comma-separated")
    parser.add_argument("candidate", metavar="B", help="candidate: run folder(s) or MLflow run id(s), comma-separated")
    parser.add_argument("--html", type=Path, help="also write the comparison as a self-contained HTML page")
    parser.add_argument(
        "--threshold",
        type=float,
        default=REGRESSION_THRESHOLD_PCT,
        help=f"percent change for the worse that the side-by-side table marks (default: {REGRESSION_THRESHOLD_PCT:g})",
    )
    parser.add_argument(
        "--fail-if-slower",
        type=_percent,
        metavar="PCT",
        help="gate: exit 1 when B is slower than A by more than PCT (e.g. 5%%) at 95 %% confidence, 0 when it is "
        "not, 3 when the noise cannot tell",
    )
    parser.add_argument(
        "--fail-if-more-memory",
        type=_percent,
        metavar="PCT",
        help="gate: exit 1 when B's peak memory exceeds A's by PCT",
    )
    parser.add_argument(
        "--metric", choices=list(METRICS), default="step", help="the figure --fail-if-slower tests (default: step)"
    )
    parser.add_argument(
        "--allow-mismatch",
        action="append",
        default=[],
        metavar="KEY",
        help="gate: compare although the runs differ in KEY (e.g. torch, world_size, config.profiler); repeatable",
    )
    parser.add_argument(
        "--drift-floor",
        type=_percent,
        default=DRIFT_FLOOR_PCT,
        metavar="PCT",
        help="gate, one run per side: the least drift between runs of one configuration to assume, as the standard "
        f"deviation of a run's median step (default: {DRIFT_FLOOR_PCT:g}%%; see docs/regression-gate.md)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON (for machines)")
    parser.add_argument("--tracking-uri", help="MLflow to download runs from (default: $MLFLOW_TRACKING_URI)")


def run(args: argparse.Namespace) -> int:
    """Print the comparison (and write --html); the gate's exit code, or 2 after a one-line error."""
    gating = args.fail_if_slower is not None or args.fail_if_more_memory is not None
    try:
        with tempfile.TemporaryDirectory(prefix="anemoi-profiler-compare-") as downloads:
            a_runs = _load_side(args.baseline, args.tracking_uri, Path(downloads) / "a")
            b_runs = _load_side(args.candidate, args.tracking_uri, Path(downloads) / "b")
            comparison = compare_runs(a_runs[0], b_runs[0], args.threshold)
            verdict = (
                run_gate(
                    a_runs,
                    b_runs,
                    args.fail_if_slower,
                    args.metric,
                    args.allow_mismatch,
                    args.fail_if_more_memory,
                    args.drift_floor,
                )
                if gating
                else None
            )
            why = why_lines(a_runs[0], b_runs[0]) if verdict is not None and not verdict.mismatches else []
            failed = gate_failed(verdict)
            if args.html:
                page = render_html(comparison, verdict_html(verdict, why) if verdict else "", failed)
                args.html.write_text(page, "utf-8")
    except (RunDownloadError, RunFolderError, OSError, GateError, GateInputError) as error:
        print(f"anemoi-profiler compare: {' '.join(str(error).split())}", file=sys.stderr)
        return USAGE_ERROR
    if args.json:
        print(json.dumps(_as_json(verdict, why), indent=2))
    else:
        head = [*verdict_lines(verdict), *why, ""] if verdict is not None else []
        print("\n".join(head) + format_text(comparison, failed, verdict is not None), end="")
        if args.html:
            print(f"written: {args.html}")
    return verdict.exit_code if verdict is not None else 0


def gate_failed(verdict: GateVerdict | None) -> GateFailed | None:
    """What the gate failed on, for the table's REGRESSION words: nothing unless it exits 1."""
    if verdict is None or verdict.exit_code != 1:
        return None
    slower = verdict.result is not None and verdict.result.outcome == "slower"
    return GateFailed(slower=slower, more_memory=verdict.memory is not None and verdict.memory.more)


def _load_side(targets: str, tracking_uri: str | None, downloads: Path) -> list[RunData]:
    names = [target for target in targets.split(",") if target]
    if not names:
        raise RunFolderError(f"no run given in {targets!r}")
    return [load_run(resolve_run(name, tracking_uri, downloads / str(k))) for k, name in enumerate(names)]


def _as_json(verdict: GateVerdict | None, why: list[str]) -> dict:
    return {**(as_json(verdict) if verdict is not None else {"exit_code": 0}), "why": why}


def _percent(text: str) -> float:
    """'5%' or '5' -> 5.0; a bad value is a usage error that names it."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (e.g. 5%)") from None
    if not 0 <= value < 1000:
        raise argparse.ArgumentTypeError(f"a percentage from 0 to 1000 is expected, not {text!r}")
    return value
