"""`anemoi-profiler analyze <trace folder | run folder | MLflow run id>`: HTA over traces, printed.

Input problems (a missing folder, no traces, a corrupt file, HTA not installed, a run that cannot be
downloaded) end with one line naming the cause and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anemoi_profiler.analysis.hta_runner import (
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TIME_LIMIT_S,
    HtaNotInstalledError,
    analyze,
    require_hta,
    write_summary,
)
from anemoi_profiler.analysis.preflight import NoTracesError, TraceError, parse_ranks
from anemoi_profiler.analysis.summary_text import format_summary
from anemoi_profiler.config import ConfigError
from anemoi_profiler.run_files.layout import ARTIFACT_ROOT, HTA_DIR, TRACES_DIR
from anemoi_profiler.tracking.run_download import RunDownloadError, resolve_run

NAME = "analyze"
HELP = "run Holistic Trace Analysis over traces (needs the 'hta' extra)"
DESCRIPTION = (
    "Run HTA over a trace folder, a run folder (every traces/<stage>/window_<k>/), or an MLflow "
    "run id (its profiler/traces artifacts), print a summary and write tables as CSV/JSON."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="trace folder, run folder, or MLflow run id")
    parser.add_argument("--output", help="where tables go (default: <target>/hta, or ./hta_<run id>)")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help=f"seconds for all analyses (default: {DEFAULT_TIME_LIMIT_S:g})",
    )
    parser.add_argument(
        "--memory-limit",
        type=float,
        default=DEFAULT_MEMORY_LIMIT_MB,
        metavar="MB",
        help=f"resident memory of the HTA process above which it is stopped (default: {DEFAULT_MEMORY_LIMIT_MB:g})",
    )
    parser.add_argument("--ranks", help="only these ranks, e.g. 0-7 or 0,4,8-11 (default: every rank)")
    parser.add_argument("--tracking-uri", help="MLflow to download a run's traces from (default: $MLFLOW_TRACKING_URI)")


def run(args: argparse.Namespace) -> int:
    if args.time_limit <= 0:
        raise ConfigError(f"--time-limit: got {args.time_limit}, expected seconds > 0")
    if args.memory_limit <= 0:
        raise ConfigError(f"--memory-limit: got {args.memory_limit}, expected MB > 0")
    try:
        ranks = parse_ranks(args.ranks) if args.ranks else None
    except ValueError as error:
        raise ConfigError(f"--ranks: {error}") from None
    return run_analyze(args.target, args.output, args.time_limit, args.tracking_uri, args.memory_limit, ranks)


def run_analyze(
    target: str,
    output: str | None,
    time_limit_s: float,
    tracking_uri: str | None = None,
    memory_limit_mb: float = DEFAULT_MEMORY_LIMIT_MB,
    ranks: list[int] | None = None,
) -> int:
    """Analyse `target` and print the summary; return 0, or 1 after a one-line message on stderr.

    `target` is a trace folder, a run folder, or (when it is no folder and a tracking URI is given, or
    set in MLFLOW_TRACKING_URI) an MLflow run id whose `profiler/traces` artifacts are analysed.
    Results go to `output`, by default `<target>/hta` for a folder and `./hta_<run id>` for a run.
    """
    analyse = functools.partial(analyze, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb, ranks=ranks)
    try:
        summary = _analyze_target(target, output, analyse, tracking_uri)
    except (TraceError, NoTracesError, HtaNotInstalledError, RunDownloadError, OSError) as error:
        print(f"anemoi-profiler analyze: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0


def _analyze_target(
    target: str, output: str | None, analyse: Callable[[Path, Path], dict[str, Any]], tracking_uri: str | None
) -> dict[str, Any]:
    if Path(target).exists():
        folder = Path(target)
        return analyse(folder, Path(output) if output else folder / HTA_DIR)
    require_hta()  # before a download that may take minutes
    out_dir = Path(output) if output else Path.cwd() / f"hta_{target}"
    with tempfile.TemporaryDirectory(prefix="anemoi-profiler-traces-") as download_dir:
        summary = analyse(resolve_run(target, tracking_uri, Path(download_dir), traces=True), out_dir)
    source = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    summary["target"] = f"MLflow run {target} ({ARTIFACT_ROOT}/{TRACES_DIR} from {source})"
    write_summary(out_dir, summary)
    return summary
