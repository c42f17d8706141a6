"""`anemoi-profiler demo`: train the bundled model with the profiler and show the report."""

from __future__ import annotations

import argparse

from anemoi_profiler.cli import config_command
from anemoi_profiler.config import ConfigError
from anemoi_profiler.logs import PREFIX

NAME = "demo"
HELP = "train a small bundled model with the profiler and show the report"
DESCRIPTION = (
    "Train a small transformer on synthetic data (CPU, or GPU when present) with the profiler "
    "callbacks, then print the report, the run folder and the command that opens MLflow."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_command.add_arguments(parser)
    parser.add_argument(
        "--max-steps", type=int, default=400, help="training steps (default: 400, one to a few minutes on CPU)"
    )
    parser.add_argument("--slow-data", action="store_true", help="make the dataloader slow, to see a data-bound run")


def run(args: argparse.Namespace) -> int:
    config = config_command.load_config(args)
    if args.max_steps < 1:
        raise ConfigError(f"--max-steps: got {args.max_steps}, expected an integer >= 1")
    say("loading torch and Lightning")
    from anemoi_profiler.demo import run_demo  # torch and Lightning only now

    run_demo(config, max_steps=args.max_steps, slow_data=args.slow_data, say=say)
    return 0


def say(text: str) -> None:
    """A phase of the demo, as it starts: the first minute shows what it waits for."""
    print(f"{PREFIX}demo: {text}", flush=True)
