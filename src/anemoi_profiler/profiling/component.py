"""Profile one module or function outside a Trainer: a LayerNorm, an attention block, a compiled kernel.

Same windows as training (`profiler.train`: skip_first, wait, warmup, active, repeat), same traces
(`traces/component/window_<k>/rank0.pt.trace.json.gz`) and the same time and memory reports, on synthetic
inputs of given shapes, dtypes and device, so that a change to one layer is measured on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf

from ..config import ConfigError, ProfilerConfig
from ..environment import collect_environment
from ..redaction import redact, redact_uri
from ..report import ReportSection, RunReport
from ..session import ARTIFACT_ROOT, create_run_folder
from ..tracking import TrackingSink, resolve_tracking_uri
from .durations import DurationStats
from .reports import summarize_windows
from .schedule import WindowSchedule
from .traces import MB, TRACES_DIR, folder_size
from .windows import ProfilingWindows

STAGE = "component"
YAML_SECTION = "component"
_NOT_UPLOADED = ("spool",)


@dataclasses.dataclass
class InputSpec:
    """One synthetic input: random normal values of this shape and floating dtype."""

    shape: tuple[int, ...]
    dtype: str = "float32"


def torch_dtype(name: str) -> torch.dtype:
    """'bfloat16' or 'torch.bfloat16' -> torch.bfloat16; only floating dtypes (inputs are random normals)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"dtype: got {name!r}, expected a floating torch dtype such as float32, bfloat16, float16")
    return dtype


def resolve_target(path: str, kwargs: Mapping[str, Any] | None = None, base_dir: Path | None = None) -> Any:
    """Call the factory at 'package.module:factory' or 'path/to/file.py:factory' and return what it builds.

    A relative file path is looked up in `base_dir` (the YAML file's folder) first, then the working directory.
    """
    location, _, name = path.rpartition(":")
    if not location or not name:
        raise ConfigError(f"target: got {path!r}, expected 'package.module:factory' or 'path/file.py:factory'")
    try:
        if location.endswith(".py"):
            file = Path(location)
            if not file.is_absolute() and base_dir is not None and (base_dir / file).is_file():
                file = base_dir / file
            spec = importlib.util.spec_from_file_location(file.stem, file)
            if spec is None or spec.loader is None or not file.is_file():
                raise ImportError(f"no such file: {file}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(location)
        factory = getattr(module, name)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"target {path!r}: cannot import it: {error}") from None
    if isinstance(factory, torch.nn.Module):
        return factory
    if not callable(factory):
        raise ConfigError(f"target {path!r} is neither a factory nor a module")
    return factory(**dict(kwargs or {}))


def make_inputs(inputs: Sequence[InputSpec], device: torch.device, requires_grad: bool) -> list[torch.Tensor]:
    return [
        torch.randn(spec.shape, dtype=torch_dtype(spec.dtype), device=device, requires_grad=requires_grad)
        for spec in inputs
    ]


def _target_name(target: Any) -> str:
    return type(target).__name__ if isinstance(target, torch.nn.Module) else getattr(target, "__name__", str(target))


def _step_function(
    target: Callable[..., Any], inputs: list[torch.Tensor], backward: bool, parameters: list[torch.Tensor]
) -> Callable[[], None]:
    """One profiled step: a forward call, then (with `backward`) the backward of its tensor outputs.

    The output gradients are ones made once, so a step holds the target's own backward and no loss ops;
    gradients are dropped after each step (like `zero_grad(set_to_none=True)`) so that all steps are alike.
    """
    grad_outputs: list[torch.Tensor] = []

    def forward() -> None:
        target(*inputs)

    def forward_backward() -> None:
        outputs = target(*inputs)
        tensors = [outputs] if isinstance(outputs, torch.Tensor) else [o for o in outputs if torch.is_tensor(o)]
        if not grad_outputs:
            grad_outputs.extend(torch.ones_like(t) for t in tensors)
        torch.autograd.backward(tensors, grad_outputs)
        for tensor in [*inputs, *parameters]:
            tensor.grad = None

    return forward_backward if backward else forward


def profile_component(
    target: Any,
    input_shapes: Sequence[Sequence[int]] = ((8, 1024),),
    dtype: str | Sequence[str] = "float32",
    device: str = "cpu",
    config: ProfilerConfig | None = None,
    compile: bool | str = False,
    backward: bool = False,
    target_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Profile `target` (a module, a callable, or a 'module:factory' path) and return the run folder.

    `dtype` is one name for all inputs or one per input; a module is moved to `device` and, for a single
    floating dtype, cast to it. `compile` is True (inductor) or a torch.compile backend name ("aot_eager").
    Windows follow `config.profiler.train`; `repeat: 0` records one window.
    With `config.tracking.enabled` the run also goes to MLflow (metrics, params and the run folder).
    """
    config = config or ProfilerConfig()
    dtypes = [dtype] * len(input_shapes) if isinstance(dtype, str) else list(dtype)
    if len(dtypes) != len(input_shapes):
        raise ConfigError(f"dtype: got {len(dtypes)} dtypes for {len(input_shapes)} inputs")
    inputs = [InputSpec(tuple(int(n) for n in shape), name) for shape, name in zip(input_shapes, dtypes, strict=True)]
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: got {device!r}, but CUDA is not available here")
    if isinstance(target, str):
        target = resolve_target(target, target_kwargs)
    name = _target_name(target)
    if isinstance(target, torch.nn.Module):
        target = target.to(torch_device)
        if len(set(dtypes)) == 1:
            target = target.to(torch_dtype(dtypes[0]))
    parameters = list(target.parameters()) if isinstance(target, torch.nn.Module) else []
    backend = "inductor" if compile is True else compile or None
    runnable = torch.compile(target, backend=backend) if backend else target

    run_dir = create_run_folder(Path(config.output_dir).resolve(), config.fingerprint())
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(redact(config.to_dict()))))
    (run_dir / "environment.json").write_text(json.dumps(collect_environment(), indent=2, default=str))
    described = {
        "target": name,
        "inputs": ", ".join(f"{tuple(i.shape)} {i.dtype}" for i in inputs),
        "device": str(torch_device),
        "compile": backend or "off",
        "backward": backward,
    }
    sink = _open_sink(config, run_dir, name)
    if sink is not None:
        sink.log_params({f"{ARTIFACT_ROOT}/component/{key}": value for key, value in described.items()})
    status = "FAILED"
    try:
        step = _step_function(runnable, make_inputs(inputs, torch_device, backward), backward, parameters)
        windows = ProfilingWindows(run_dir, 0, 1, config.profiler, torch_device)
        calls, steps = _run_windows(step, windows, WindowSchedule.from_config(config.profiler.train), torch_device)
        sections, metrics = summarize_windows(windows, _upload_note(config, run_dir))
        component_section, component_metrics = _component_section(calls, steps)
        metrics.update(component_metrics)
        report = RunReport({"run folder": str(run_dir), **described})
        for section in [component_section, *sections]:
            report.add(section)
        report.write(run_dir, txt=config.report.txt, as_json=config.report.json)
        if config.report.console:
            report.print_console()
        if sink is not None:
            sink.log_metrics(metrics, steps)
        status = "FINISHED"
    finally:
        if sink is not None:
            _upload_run_folder(sink, run_dir, config)
            sink.close(status, timeout_s=config.tracking.close_timeout_s)
        _print_where_to_look(run_dir, sink)
    return run_dir


def _run_windows(
    step: Callable[[], None], windows: ProfilingWindows, schedule: WindowSchedule, device: torch.device
) -> tuple[DurationStats, int]:
    """Run `step` through the windows; return the call durations (the first call apart) and the step count."""
    schedule = dataclasses.replace(schedule, repeat=schedule.repeat or 1)
    total = schedule.skip_first + schedule.repeat * schedule.cycle
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    calls = DurationStats()
    recorder = None
    try:
        for batch in range(total):
            if batch >= schedule.start:
                windows.batch_starting(STAGE, schedule, batch)
                recorder = recorder or windows.open(STAGE, schedule, batch)
            started = time.perf_counter()
            step()
            synchronize()  # outside Lightning a sync per step is fine: it makes each call's time its own
            calls.add("first call" if batch == 0 else "call", time.perf_counter() - started)
            if recorder is not None:
                windows.batch_ended(recorder, batch)
    finally:
        if recorder is not None:
            recorder.stop()
        windows.close()
    return calls, total


def _component_section(calls: DurationStats, steps: int) -> tuple[ReportSection, dict[str, float]]:
    stats = calls.summary()
    values: dict[str, tuple[Any, str]] = {"steps": (steps, "")}
    metrics: dict[str, float] = {}
    if "first call" in stats:
        values["first call (compiles, warms caches)"] = (stats["first call"]["mean_ms"], "ms")
        metrics["summary/component/first_call_ms"] = stats["first call"]["mean_ms"]
    if "call" in stats:
        for key in ("mean_ms", "p50_ms", "p90_ms", "max_ms"):
            values[f"call {key.removesuffix('_ms')}"] = (stats["call"][key], "ms")
            metrics[f"summary/component/call_{key}"] = stats["call"][key]
    note = "Wall time per call including the profiler's overhead in active steps; the device is synchronized."
    return ReportSection.key_values("Component", values, note), metrics


def _traces_uploadable(config: ProfilerConfig, run_dir: Path) -> bool:
    traces_dir = run_dir / TRACES_DIR
    traces_mb = folder_size(traces_dir) / MB if traces_dir.is_dir() else 0.0
    return traces_mb <= config.profiler.upload_traces_max_mb


def _upload_note(config: ProfilerConfig, run_dir: Path) -> str:
    if not (config.tracking.enabled and config.tracking.upload_artifacts):
        return "not uploaded (tracking off)"
    if not _traces_uploadable(config, run_dir):
        return (
            f"kept in the run folder only (over profiler.upload_traces_max_mb={config.profiler.upload_traces_max_mb:g})"
        )
    return "uploaded to MLflow with the run"


def _open_sink(config: ProfilerConfig, run_dir: Path, name: str) -> TrackingSink | None:
    tracking = config.tracking
    if not tracking.enabled:
        return None
    return TrackingSink(
        resolve_tracking_uri(tracking.uri, None, config.output_dir),
        tracking.experiment,
        run_dir / "spool" / "rank0",
        run_name=tracking.run_name or f"component-{name}-{run_dir.name}",
        tags={"anemoi_profiler.run_folder": str(run_dir), "anemoi_profiler.component": name},
        flush_interval_s=tracking.flush_interval_s,
        retry_interval_s=tracking.retry_interval_s,
    )


def _upload_run_folder(sink: TrackingSink, run_dir: Path, config: ProfilerConfig) -> None:
    if not config.tracking.upload_artifacts:
        return
    skipped = {run_dir / name for name in _NOT_UPLOADED}
    if not _traces_uploadable(config, run_dir):
        skipped.add(run_dir / TRACES_DIR)
    for path in sorted(run_dir.rglob("*")):
        if path.is_file() and not skipped.intersection(path.parents):
            sink.log_artifact(path, str(Path(ARTIFACT_ROOT) / path.relative_to(run_dir).parent))


def _print_where_to_look(run_dir: Path, sink: TrackingSink | None) -> None:
    lines = [f"anemoi-profiler: run folder {run_dir}"]
    if sink is not None:
        lines.append(f"anemoi-profiler: MLflow run {sink.run_id} at {redact_uri(sink.tracking_uri)}")
        if sink.tracking_uri.startswith("sqlite:"):
            lines.append(f"anemoi-profiler: open it with: mlflow ui --backend-store-uri {sink.tracking_uri}")
    print("\n".join(lines), flush=True)


# ---- command line ----
def add_component_arguments(parser: argparse.ArgumentParser) -> None:
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


def run_component_cli(args: argparse.Namespace) -> int:
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
    allowed = {"target", "kwargs", "inputs", "dtype", "device", "compile", "backward"}
    unknown = sorted(set(component) - allowed)
    if unknown:
        raise ConfigError(f"{YAML_SECTION}.{unknown[0]}: unknown key; allowed keys: {', '.join(sorted(allowed))}")
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
