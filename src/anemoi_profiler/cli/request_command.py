"""`anemoi-profiler request <run folder | MLflow run id>`: ask a running job for a profiling window, without a
daemon or a signal.

With a run folder it writes the request file into it (a shared filesystem reaches every node); with an MLflow
run id it sets the run's `profiler.request` tag, which the job's rank 0 copies into its run folder (from its
MLflow sender process, every few seconds): the way from a laptop that reaches only the tracking server. The
job's rank 0 looks for the file every `triggers.request_poll_s` seconds and every rank opens the window at the
same batch. With `--wait` the command waits for the answer: the window and the batch it was served at.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anemoi_profiler.logs import PREFIX
from anemoi_profiler.run_files.layout import (
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    REQUEST_FILE,
    WINDOWS_FILE,
    has_run_folder_name,
)
from anemoi_profiler.triggers.requests import (
    REQUEST_TAG,
    SERVED_TAG,
    WindowRequest,
    new_request,
    read_request,
    write_request,
)

CONFIG_WAIT_S = 5.0
"""How long a new run folder may stay without its config copy before `request` refuses it."""
NAME = "request"
HELP = "ask a running job for a profiling window (needs triggers.enabled in its config)"
DESCRIPTION = (
    "Asks through the job's run folder or its MLflow run; the job records a window of --steps batches on --ranks "
    f"at its next log interval and answers in {REQUEST_FILE}, {WINDOWS_FILE} and the run's {SERVED_TAG} tag."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="the running job's run folder (printed at its start), or its MLflow run id")
    parser.add_argument("--steps", type=int, default=3, help="batches recorded (default: 3)")
    parser.add_argument("--ranks", default="", help="global ranks that record, e.g. 0,3 (default: profiled_ranks)")
    parser.add_argument(
        "--memory", action="store_true", help="also a CUDA memory snapshot of the window (not assessed on CPU)"
    )
    parser.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the answer")
    parser.add_argument("--tracking-uri", help="for a run id: the job's MLflow (default: $MLFLOW_TRACKING_URI)")


def run(args: argparse.Namespace) -> int:
    try:
        request = new_request(args.steps, _ranks(args.ranks), args.memory)
    except ValueError as error:
        print(f"{PREFIX}{error}", file=sys.stderr)
        return 1
    run_dir = Path(args.target)
    if run_dir.is_dir():
        if not _config_written(run_dir):
            print(f"{PREFIX}{run_dir} is not a run folder (no {CONFIG_FILE})", file=sys.stderr)
            return 1
        world_size = _world_size(run_dir)
        if world_size is not None and any(rank >= world_size for rank in request.ranks):
            known = f"the job has {world_size} ranks (0 to {world_size - 1})"
            print(f"{PREFIX}--ranks: got {request.ranks}, {known}", file=sys.stderr)
            return 1
        write_request(run_dir, request)
        where = str(run_dir)
        answer = lambda: _answer_in_folder(run_dir, request)  # noqa: E731
    else:
        uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            print(f"{PREFIX}{args.target} is no folder; for a run id give --tracking-uri", file=sys.stderr)
            return 1
        try:
            answer = _ask_mlflow(uri, args.target, request)
        except Exception as error:  # MLflow's errors: an unknown run, an unreachable server
            print(
                f"{PREFIX}cannot ask run {args.target}: {(str(error).splitlines() or [''])[0]}",
                file=sys.stderr,
            )
            return 1
        where = f"MLflow run {args.target}"
    print(f"{PREFIX}requested a {request.steps}-step window (request {request.id}) in {where}")
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        served = answer()
        if served is not None:
            print(f"{PREFIX}served as train window {served[0]} from batch {served[1]}")
            return 0
        time.sleep(0.5)
    if args.wait:
        print(f"{PREFIX}not served within {args.wait:g} s (does the job have triggers.enabled?)")
        return 3
    return 0


def _ranks(text: str) -> list[int]:
    try:
        return [int(rank) for rank in text.split(",") if rank.strip()]
    except ValueError:
        raise ValueError(f"--ranks: got {text!r}, expected global ranks such as 0,3") from None


def _config_written(run_dir: Path) -> bool:
    """Whether `run_dir` has its config copy. A folder named as a run folder gets it a moment after it appears
    (on a shared filesystem, maybe seconds later on another node): wait up to `CONFIG_WAIT_S` for it."""
    deadline = time.monotonic() + (CONFIG_WAIT_S if has_run_folder_name(run_dir) else 0.0)
    while not (run_dir / CONFIG_FILE).is_file():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _world_size(run_dir: Path) -> int | None:
    """The job's world size from its environment.json; None where it cannot be read (the job checks too)."""
    try:
        return int(json.loads((run_dir / ENVIRONMENT_FILE).read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _answer_in_folder(run_dir: Path, request: WindowRequest) -> tuple[int, int] | None:
    answer = read_request(run_dir)
    if answer is None or answer.id != request.id or answer.served_at_step is None:
        return None
    return answer.served_window or 0, answer.served_at_step


def _ask_mlflow(uri: str, run_id: str, request: WindowRequest) -> Callable[[], tuple[int, int] | None]:
    """Set the request tag; return what reads the answer tag."""
    from dataclasses import asdict

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    client.set_tag(run_id, REQUEST_TAG, json.dumps(asdict(request)))

    def answer() -> tuple[int, int] | None:
        served: dict[str, Any] = json.loads(client.get_run(run_id).data.tags.get(SERVED_TAG) or "{}")
        return (served["window"], served["batch"]) if served.get("id") == request.id else None

    return answer
