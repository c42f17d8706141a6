"""`anemoi-profiler sync <run folder>`: send what MLflow missed (the spool) into the run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from anemoi_profiler.logs import PREFIX
from anemoi_profiler.redaction import redact_text
from anemoi_profiler.run_files.layout import spool_dirs

NAME = "sync"
HELP = "send metrics and artifacts kept in a run folder's spool to MLflow"
DESCRIPTION = "Replay <run folder>/spool/ (what could not be sent while MLflow was away) into the run."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_folder", type=Path)
    parser.add_argument("--tracking-uri", help="send to this MLflow instead of the one recorded in the spool")


def run(args: argparse.Namespace) -> int:
    from anemoi_profiler.tracking.mlflow_target import MlflowTarget
    from anemoi_profiler.tracking.spool import replay_spool

    spools = spool_dirs(args.run_folder)
    if not spools:
        print(f"{PREFIX}nothing to sync: no spool in {args.run_folder}", file=sys.stderr)
        return 1
    failed = 0
    for spool in spools:
        try:
            sent, left = replay_spool(spool, MlflowTarget(spool, args.tracking_uri))
        except Exception as error:
            reason = redact_text(" ".join(str(error).split()))
            print(f"{PREFIX}{spool}: MLflow did not accept the spool: {reason}", file=sys.stderr)
            failed += 1
            continue
        print(f"{spool}: sent {sent} batch(es), {left} left")
        failed += bool(left)
    return 1 if failed else 0
