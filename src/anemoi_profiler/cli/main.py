"""`anemoi-profiler <command>`: demo, component, report, compare, config, analyze, summarize, sync, request."""

from __future__ import annotations

import argparse
import logging
import sys

from anemoi_profiler.cli import analyze_command as analyze
from anemoi_profiler.cli import compare_command as compare
from anemoi_profiler.cli import component_command as component
from anemoi_profiler.cli import config_command as config
from anemoi_profiler.cli import demo_command as demo
from anemoi_profiler.cli import report_command as report
from anemoi_profiler.cli import request_command as request
from anemoi_profiler.cli import summarize_command as summarize
from anemoi_profiler.cli import sync_command as sync
from anemoi_profiler.config import ConfigError
from anemoi_profiler.logs import PREFIX

COMMANDS = (demo, component, report, compare, config, analyze, summarize, sync, request)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _show_our_warnings()
    try:
        return int(args.run(args) or 0)
    except ConfigError as error:
        print(f"{PREFIX}config error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anemoi-profiler",
        description="Profile PyTorch Lightning training: throughput, step time, memory and system metrics in "
        "MLflow, traces for HTA.",
        epilog="Docs: README.md and docs/. Each command has --help.",
    )
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command_parser = commands.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(command_parser)
        command_parser.set_defaults(run=command.run)
    return parser


def _show_our_warnings() -> None:
    """Our warnings on stderr, once. A handler on the root logger instead would print Lightning's messages
    a second time beside its own handler (every INFO line of a demo fit, twice)."""
    package = logging.getLogger("anemoi_profiler")
    if not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.setLevel(logging.WARNING)  # on the handler: the logger's own level stays the caller's to set
        package.addHandler(handler)
