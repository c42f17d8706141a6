"""`anemoi-profiler request <run folder>`: ask a running job for a profiling window, without a daemon or a signal.

It writes the request file into the job's run folder (a shared filesystem reaches every node); the job's rank 0
looks for it every `triggers.request_poll_s` seconds and every rank opens the window at the same batch. With
`--wait` the command waits for the answer: the window and the step it was served at.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..layout import CONFIG_FILE, REQUEST_FILE, WINDOWS_FILE
from ..triggers.requests import read_request, write_request

NAME = "request"
HELP = "ask a running job for a profiling window (needs triggers.enabled in its config)"
DESCRIPTION = (
    "Writes a request into the job's run folder; the job records a window of --steps batches on --ranks at its "
    f"next log interval and answers in {REQUEST_FILE} and {WINDOWS_FILE}."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_folder", help="the running job's run folder (printed at its start)")
    parser.add_argument("--steps", type=int, default=3, help="batches recorded (default: 3)")
    parser.add_argument("--ranks", default="", help="global ranks that record, e.g. 0,3 (default: profiled_ranks)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the answer")


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_folder)
    if not (run_dir / CONFIG_FILE).is_file():
        print(f"anemoi-profiler: {run_dir} is not a run folder (no {CONFIG_FILE})", file=sys.stderr)
        return 1
    try:
        ranks = _ranks(args.ranks)
        request = write_request(run_dir, args.steps, ranks)
    except ValueError as error:
        print(f"anemoi-profiler: {error}", file=sys.stderr)
        return 1
    print(f"anemoi-profiler: requested a {request.steps}-step window (request {request.id}) in {run_dir}")
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        answer = read_request(run_dir)
        if answer is not None and answer.id == request.id and answer.served_at_step is not None:
            print(f"anemoi-profiler: served as train window {answer.served_window} from batch {answer.served_at_step}")
            return 0
        time.sleep(0.5)
    if args.wait:
        print(f"anemoi-profiler: not served within {args.wait:g} s; the job answers in {run_dir / REQUEST_FILE}")
        return 3
    return 0


def _ranks(text: str) -> list[int]:
    try:
        return [int(rank) for rank in text.split(",") if rank.strip()]
    except ValueError:
        raise ValueError(f"--ranks: got {text!r}, expected global ranks such as 0,3") from None
