"""The `anemoi-profiler` command: demo, component, analyze, report, compare, config, sync."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .compare import add_compare_arguments, run_compare_cli
from .config import PRESETS, ConfigError, ProfilerConfig
from .profiling.component import add_component_arguments, run_component_cli
from .redaction import redact_text
from .report_command import add_report_arguments, run_report_cli
from .run_data import MLFLOW_RUN_ID


def _show_our_warnings() -> None:
    """Our warnings on stderr, once. A handler on the root logger instead would print Lightning's messages
    a second time beside its own handler (every INFO line of a demo fit, twice)."""
    package = logging.getLogger("anemoi_profiler")
    if not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.setLevel(logging.WARNING)  # on the handler: the logger's own level stays the caller's to set
        package.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _show_our_warnings()
    try:
        return int(args.handler(args) or 0)
    except ConfigError as error:
        print(f"anemoi-profiler: config error: {error}", file=sys.stderr)
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

    demo = commands.add_parser(
        "demo",
        help="train a small bundled model with the profiler and show the report",
        description="Train a small transformer on synthetic data (CPU, or GPU when present) with the profiler "
        "callbacks, then print the report, the run folder and the command that opens MLflow.",
    )
    _add_config_arguments(demo)
    demo.add_argument("--max-steps", type=int, default=400, help="training steps (default: 400, about a minute on CPU)")
    demo.add_argument("--slow-data", action="store_true", help="make the dataloader slow, to see a data-bound run")
    demo.set_defaults(handler=_demo)

    component = commands.add_parser(
        "component",
        help="profile one module or function outside a Trainer",
        description="Profile an nn.Module or callable (e.g. a norm layer, with or without torch.compile) on "
        "synthetic inputs, with the same windows, reports and run folder as a training run.",
    )
    add_component_arguments(component)
    component.set_defaults(handler=run_component_cli)

    report = commands.add_parser(
        "report",
        help="regenerate a run's diagnosis, report.txt/json and report.html",
        description="From a run folder, or an MLflow run id (its profiler/ artifacts).",
    )
    add_report_arguments(report)
    report.set_defaults(handler=run_report_cli)

    compare = commands.add_parser(
        "compare",
        help="two runs side by side, regressions marked",
        description="Compare run B against baseline A (run folders or MLflow run ids): throughput, step time, "
        "peak memory, top operators; differences are B - A.",
    )
    add_compare_arguments(compare)
    compare.set_defaults(handler=run_compare_cli)

    show = commands.add_parser(
        "config",
        help="validate a config and print it resolved",
        description="Load, validate and print a config.",
    )
    _add_config_arguments(show)
    show.set_defaults(handler=_show_config)

    analyze = commands.add_parser(
        "analyze",
        help="run Holistic Trace Analysis over traces (needs the 'hta' extra)",
        description="Run HTA over a trace folder, a run folder (every traces/<stage>/window_<k>/), or an MLflow "
        "run id (its profiler/traces artifacts), print a summary and write tables as CSV/JSON.",
    )
    analyze.add_argument("target", help="trace folder, run folder, or MLflow run id")
    analyze.add_argument("--output", help="where tables go (default: <target>/hta, or ./hta_<run id>)")
    analyze.add_argument("--time-limit", type=float, default=300.0, help="seconds for all analyses (default: 300)")
    analyze.add_argument(
        "--tracking-uri", help="MLflow to download a run's traces from (default: $MLFLOW_TRACKING_URI)"
    )
    analyze.set_defaults(handler=_analyze)

    sync = commands.add_parser(
        "sync",
        help="send metrics and artifacts kept in a run folder's spool to MLflow",
        description="Replay <run folder>/spool/ (what could not be sent while MLflow was away) into the run.",
    )
    sync.add_argument("run_folder", type=Path)
    sync.add_argument("--tracking-uri", help="send to this MLflow instead of the one recorded in the spool")
    sync.set_defaults(handler=_sync)
    return parser


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with profiler settings")
    parser.add_argument("--preset", choices=PRESETS, help="start from a preset instead of the defaults")
    parser.add_argument("--output-dir", help="where run folders (and the default MLflow store) go")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. system.interval_s=2")


def _load_config(args: argparse.Namespace) -> ProfilerConfig:
    if args.config and args.preset:
        raise ConfigError("give either --config or --preset, not both")
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    return ProfilerConfig.load(args.config or args.preset, overrides)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    config = _load_config(args)
    if args.max_steps < 1:
        raise ConfigError(f"--max-steps: got {args.max_steps}, expected an integer >= 1")
    run_demo(config, max_steps=args.max_steps, slow_data=args.slow_data)
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from .analysis import run_analyze_cli

    if args.time_limit <= 0:
        raise ConfigError(f"--time-limit: got {args.time_limit}, expected seconds > 0")
    if not Path(args.target).exists() and not MLFLOW_RUN_ID.fullmatch(args.target):
        print(
            f"anemoi-profiler analyze: no such folder: {args.target} (nor an MLflow run id, which has only letters, "
            "digits, '-' and '_')",
            file=sys.stderr,
        )
        return 1
    return run_analyze_cli(args.target, args.output, args.time_limit, args.tracking_uri)


def _show_config(args: argparse.Namespace) -> int:
    print(_load_config(args).to_yaml(), end="")
    return 0


def _sync(args: argparse.Namespace) -> int:
    from .tracking import replay_spool

    spools = sorted(p.parent for p in (args.run_folder / "spool").glob("*/run.json"))
    if not spools:
        print(f"anemoi-profiler: nothing to sync: no spool in {args.run_folder}", file=sys.stderr)
        return 1
    failed = 0
    for spool in spools:
        try:
            sent, left = replay_spool(spool, args.tracking_uri)
        except Exception as error:
            reason = redact_text(" ".join(str(error).split()))
            print(f"anemoi-profiler: {spool}: MLflow did not accept the spool: {reason}", file=sys.stderr)
            failed += 1
            continue
        print(f"{spool}: sent {sent} batch(es), {left} left")
        failed += bool(left)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
