"""`anemoi-profiler report <run folder | MLflow run id>`: the diagnosis and report.html again, from the files.

For runs made before the diagnosis or the HTML page existed, and for runs only in MLflow: the report
inputs of the run's `profiler/` artifacts are downloaded (never its traces). Input problems end with one
line naming the cause and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from anemoi_profiler.report_sections import ReportSection, RunReport, plain_table
from anemoi_profiler.reports.diagnosis import TITLE as DIAGNOSIS_TITLE
from anemoi_profiler.reports.diagnosis import Outcome, assess, render_section
from anemoi_profiler.reports.run_data import RunData, RunFolderError, load_run
from anemoi_profiler.run_files.postmortem_files import kinds
from anemoi_profiler.tracking.run_download import RunDownloadError, resolve_run

NAME = "report"
HELP = "regenerate a run's diagnosis, report.txt/json and report.html"
DESCRIPTION = "From a run folder, or an MLflow run id (its profiler/ artifacts)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="run folder, or MLflow run id")
    parser.add_argument(
        "--output", help="for an MLflow run: where its files are downloaded and the reports written "
        "(default: ./report_<run id>)"
    )  # fmt: skip
    parser.add_argument("--tracking-uri", help="MLflow to download the run from (default: $MLFLOW_TRACKING_URI)")


def run(args: argparse.Namespace) -> int:
    """Regenerate the reports, print the diagnosis and where the files are; 0, or 1 after a one-line error."""
    try:
        folder = resolve_run(args.target, args.tracking_uri, Path(args.output or f"report_{args.target}"))
        loaded = load_run(folder)  # refuses a folder that is no run folder before anything is written
        outcomes = assess(loaded)
        written = regenerate_reports(loaded, outcomes)
    except (RunDownloadError, RunFolderError, OSError) as error:
        print(f"anemoi-profiler report: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    diagnosis = render_section(outcomes)
    print("\n".join(line.rstrip() for line in [diagnosis.title, *plain_table(diagnosis.columns, diagnosis.rows)]))
    print("written: " + ", ".join(str(path) for path in written))
    return 0


def regenerate_reports(run: RunData, outcomes: dict[str, Outcome]) -> list[Path]:
    """report.txt and report.json with the diagnosis of `outcomes` first (when the run has a readable
    report.json), and report.html."""
    from anemoi_profiler.reports.html import (
        write_html_report,  # the report modules only now: `anemoi-profiler --help` stays fast
    )

    written = []
    header = dict(run.header) or _killed_header(run)
    if header or run.sections:
        sections = [render_section(outcomes)]  # the diagnosis opens the report
        sections += [
            ReportSection(title, s.get("columns") or [], s.get("rows") or [], s.get("data") or {}, s.get("note") or "")
            for title, s in run.sections.items()
            if title != DIAGNOSIS_TITLE
        ]
        written += RunReport(header, sections).write(run.folder)
    written.append(write_html_report(run, outcomes))
    return written


def _killed_header(run: RunData) -> dict[str, str]:
    """The header of a run whose processes were killed before its report, as its post-mortem says it; none for a
    run without one."""
    if not kinds(run.folder):
        return {}
    return {"run folder": str(run.folder), "status": "ended before its report: its processes were killed"}
