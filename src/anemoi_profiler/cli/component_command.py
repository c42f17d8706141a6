"""`anemoi-profiler component`: profile one module or function outside a Trainer, from flags or a YAML file."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml

from anemoi_profiler.config import ConfigError, ProfilerConfig

YAML_SECTION = "component"
COMPONENT_KEYS = ("target", "kwargs", "inputs", "dtype", "device", "compile", "backward")


NAME = "component"
HELP = "profile one module or function outside a Trainer"
DESCRIPTION = (
    "Profile an nn.Module or callable (e.g. a norm layer, with or without torch.compile) on "
    "synthetic inputs, with the same windows, reports and run folder as a training run."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `anemoi-profiler component`; flags override the YAML file's `component:` section."""
    parser.add_argument("--target", help="'package.module:factory' or 'path/file.py:factory' returning a module")
    parser.add_argument(
        "--input-shape",
        action="append",
        type=_shape,
        metavar="N,M,...",
        help="shape of one synthetic input, e.g. 8,1024; repeat for several inputs",
    )
    parser.add_argument("--dtype", help="input dtype (default float32), e.g. bfloat16")
    parser.add_argument("--device", help="cpu (default), cuda or cuda:N")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="wrap the target in torch.compile (backend inductor, or the one named, e.g. aot_eager)",
    )
    parser.add_argument("--backward", action="store_true", default=None, help="also run backward of the outputs' sum")
    parser.add_argument("--config", type=Path, help="YAML with profiler settings and a 'component:' section")
    parser.add_argument("--output-dir", help="where run folders (and the default MLflow store) go")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. profiler.top_n=20")


def run(args: argparse.Namespace) -> int:
    """Run `anemoi-profiler component` from parsed arguments; returns the exit code."""
    component, settings = load_component_file(args.config) if args.config else ({}, None)
    overrides = [*args.overrides, *([f"output_dir={args.output_dir}"] if args.output_dir else [])]
    config = ProfilerConfig.load(settings, overrides)
    target = args.target or component.get("target")
    if not target:
        raise ConfigError("component: give --target package.module:factory, or component.target in --config")
    base_dir = args.config.parent if args.config and not args.target else None
    inputs = component.get("inputs") or [{"shape": [8, 1024]}]
    if args.input_shape:
        inputs = [{"shape": list(shape)} for shape in args.input_shape]
    default_dtype = str(component.get("dtype", "float32"))
    from anemoi_profiler.component import profile_component, resolve_target  # torch only now

    profile_component(
        resolve_target(str(target), component.get("kwargs"), base_dir),
        input_shapes=[tuple(spec["shape"]) for spec in inputs],
        dtype=[args.dtype or str(spec.get("dtype", default_dtype)) for spec in inputs],
        device=args.device or component.get("device", "cpu"),
        config=config,
        compile=args.compile or component.get("compile", False),
        backward=bool(args.backward if args.backward is not None else component.get("backward", False)),
    )
    return 0


def load_component_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a YAML file into its `component:` section and the profiler settings (everything else)."""
    if not path.is_file():
        raise ConfigError(f"config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    component = data.pop(YAML_SECTION, None) or {}
    if not isinstance(component, dict):
        raise ConfigError(f"{path}: '{YAML_SECTION}' must be a mapping (target, kwargs, inputs, dtype, ...)")
    unknown = sorted(set(component) - set(COMPONENT_KEYS))
    if unknown:
        allowed = ", ".join(sorted(COMPONENT_KEYS))
        raise ConfigError(f"{YAML_SECTION}.{unknown[0]}: unknown key; allowed keys: {allowed}")
    for index, spec in enumerate(component.get("inputs") or []):
        if not isinstance(spec, dict) or "shape" not in spec:
            raise ConfigError(f"{YAML_SECTION}.inputs[{index}]: expected a mapping with 'shape' (and 'dtype')")
    return component, data


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in re.split(r"[,x]", text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 8,1024; got {text!r}") from None
    if not shape or any(n <= 0 for n in shape):
        raise argparse.ArgumentTypeError(f"expected positive sizes, e.g. 8,1024; got {text!r}")
    return shape
