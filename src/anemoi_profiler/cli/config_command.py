"""`anemoi-profiler config`: validate a config and print it resolved; the config arguments other commands share."""

from __future__ import annotations

import argparse

from anemoi_profiler.config import PRESETS, ConfigError, ProfilerConfig

NAME = "config"
HELP = "validate a config and print it resolved"
DESCRIPTION = "Load, validate and print a config."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The config arguments, shared by the commands that load a config."""
    parser.add_argument("--config", help="YAML file with profiler settings")
    parser.add_argument("--preset", choices=PRESETS, help="start from a preset instead of the defaults")
    parser.add_argument("--output-dir", help="where run folders (and the default MLflow store) go")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. system.interval_s=2")


def load_config(args: argparse.Namespace) -> ProfilerConfig:
    if args.config and args.preset:
        raise ConfigError("give either --config or --preset, not both")
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    return ProfilerConfig.load(args.config or args.preset, overrides)


def run(args: argparse.Namespace) -> int:
    print(load_config(args).to_yaml(), end="")
    return 0
