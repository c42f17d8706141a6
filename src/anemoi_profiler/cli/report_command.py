"""`anemoi-profiler report <run folder | MLflow run id>`: the diagnosis and report.html again, from the files.

For runs made before the diagnosis or the HTML page existed, and for runs only in MLflow: the report
inputs of the run's `profiler/` artifacts are downloaded (never its traces). Input problems end with one
line naming the cause and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from anemoi_profiler.report_sections import ReportSection, RunReport, plain_table
from anemoi_profiler.reports.diagnosis import TITLE as DIAGNOSIS_TITLE
from anemoi_profiler.reports.diagnosis import Outcome, assess, render_section
from anemoi_profiler.reports.run_data import RunData, RunFolderError, load_run
from anemoi_profiler.run_files.layout import METRICS_FILE, SPOOL_DIR, STEPS_FILE
from anemoi_profiler.run_files.postmortem_files import headline, kinds, read_records
from anemoi_profiler.tracking.run_download import RunDownloadError, resolve_run
from anemoi_profiler.tracking.spool import pending_batches, read_batch

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
        if not loaded.header:  # no report.json: its processes died before their report
            loaded.metrics = loaded.metrics or spooled_metrics(loaded.folder)
            loaded.header = _killed_header(loaded)
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
    header = dict(run.header)
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
    """The header of a run whose processes died before its report: what stopped them, as its post-mortem says
    it, and what the report is made from instead (`missing`)."""
    header = {"run folder": str(run.folder), "status": "ended before its report: its processes were killed"}
    if found := headline(run.folder):
        header["postmortem"] = found
    killed = read_records(run.folder, "killed_rank*.json")
    if killed:
        first = min(killed, key=lambda record: record["rank"])
        step = "before its first logged step" if first.get("step") is None else f"after step {first['step']}"
        what = f"rank {first['rank']} was killed {step}"
    elif kinds(run.folder):
        what = "its processes were killed"
    else:
        what = "its processes ended before it"
        header["status"] = "ended before its report"
    made_from = [name for name in (STEPS_FILE, METRICS_FILE) if (run.folder / name).is_file()]
    spooled = _spooled(run.folder)
    if spooled:
        made_from.append(
            f"{len(spooled)} spooled batch(es) never sent to MLflow (anemoi-profiler sync {run.folder} sends them)"
        )
    header["missing"] = f"no report was written: {what}; made from " + (
        ", ".join(made_from) if made_from else "the post-mortem alone (no metrics were kept)"
    )
    return header


def _spooled(folder: Path) -> list[Path]:
    return [path for spool in sorted((folder / SPOOL_DIR).glob("rank*")) for path in pending_batches(spool)]


def spooled_metrics(folder: Path) -> dict[str, dict[str, list[Any]]]:
    """metrics.json's form of the points spooled for MLflow and never sent: what a run whose sender died too left."""
    history: dict[str, dict[str, list[Any]]] = {}
    for path in _spooled(folder):
        try:
            batch = read_batch(path)
        except (OSError, ValueError, TypeError):
            continue
        for key, value, timestamp_ms, step in batch.metrics:
            points = history.setdefault(key, {"step": [], "value": [], "time": []})
            points["step"].append(int(step))
            points["value"].append(float(value))
            points["time"].append(timestamp_ms / 1000)
    return history
