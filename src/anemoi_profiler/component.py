"""Profile one module or function outside a Trainer: a LayerNorm, an attention block, a compiled kernel.

Same windows as training (`profiler.train`: skip_first, wait, warmup, active, repeat), same traces
(`traces/component/window_<k>/rank0.pt.trace.json.gz`) and the same time and memory reports, on synthetic
inputs of given shapes, dtypes and device, so that a change to one layer is measured on its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from anemoi_profiler import names
from anemoi_profiler.cluster.window_exchange import exchange_summaries, spread_metrics, write_tables
from anemoi_profiler.config import ConfigError, ProfilerConfig
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.profiling.durations import DurationStats
from anemoi_profiler.profiling.operator_reports import summarize_windows
from anemoi_profiler.profiling.schedule import WindowSchedule
from anemoi_profiler.profiling.traces import TracesUpload
from anemoi_profiler.profiling.windows import ProfilingWindows
from anemoi_profiler.report_sections import ReportSection, RunReport
from anemoi_profiler.run import run_page
from anemoi_profiler.run.environment import collect_environment
from anemoi_profiler.run.folder import print_where_to_look, upload_folder, write_run_folder
from anemoi_profiler.run.spooled_sink import open_sink
from anemoi_profiler.run_files.layout import TRACES_DIR
from anemoi_profiler.tracking.uris import resolve_tracking_uri

STAGE = "component"


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
    target: Callable[..., Any], inputs: list[torch.Tensor], backward: bool, parameters: Sequence[torch.Tensor]
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

    Args:
        target: An `nn.Module`, a callable taking the inputs, or a `'package.module:factory'` or
            `'path/file.py:factory'` string whose factory builds one.
        input_shapes: One shape per positional input; random tensors of these shapes are the inputs.
        dtype: One dtype name for all inputs, or one per input.
        device: Where the inputs (and a module) go: `cpu`, `cuda`, `cuda:1`.
        config: The profiler's config (windows, output folder, tracking); None: the defaults.
        compile: False: eager; True: `torch.compile` with inductor; a string: that backend.
        backward: Also run the backward of the tensor outputs in every step (output gradients of ones).
        target_kwargs: Keyword arguments for the factory of a string target.

    Returns:
        The run folder, with the traces and the time and memory reports.

    Raises:
        ConfigError: The dtypes do not match the inputs, CUDA is asked for and missing, or a string target
            cannot be imported.
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

    environment = collect_environment()
    run_dir = write_run_folder(config, environment)
    described = {
        "target": name,
        "inputs": ", ".join(f"{tuple(i.shape)} {i.dtype}" for i in inputs),
        "device": str(torch_device),
        "compile": backend or "off",
        "backward": backward,
    }
    tracking = config.tracking
    sink = (
        open_sink(
            config,
            run_dir,
            0,
            resolve_tracking_uri(tracking.uri, None, config.output_dir),
            run_name=tracking.run_name or f"component-{name}-{run_dir.name}",
        )
        if tracking.enabled
        else None
    )
    if sink is not None:
        sink.set_tags({**run_page.start_tags(environment, run_dir, str(torch_device), 1), "profiler.component": name})
        sink.log_params(
            {**run_page.config_params(config, run_dir), **{f"profiler.component.{k}": v for k, v in described.items()}}
        )
    status = "FAILED"
    try:
        step = _step_function(runnable, make_inputs(inputs, torch_device, backward), backward, parameters)
        windows = ProfilingWindows(run_dir, 0, 1, config.profiler, torch_device)
        calls, steps = _run_windows(step, windows, WindowSchedule.from_config(config.profiler.train), torch_device)
        uploading = sink is not None and tracking.upload_artifacts
        traces = TracesUpload.of(run_dir, config.profiler)
        sections, metrics = summarize_windows(windows, traces.note if uploading else "not uploaded (tracking off)")
        if windows.summaries is not None:
            mine = windows.summaries.collect()
            tables = exchange_summaries(RankExchange(), run_dir, mine, slots=len(mine))
            write_tables(run_dir, tables)
            for (stage, window), table in tables.items():
                if sink is not None:
                    sink.log_metrics(spread_metrics(stage, table), window)
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
            if tracking.upload_artifacts:
                traces = TracesUpload.of(run_dir, config.profiler)
                upload_folder(sink, run_dir, () if traces.uploaded else [run_dir / TRACES_DIR])
            sink.close(status, timeout_s=tracking.close_timeout_s)
        print_where_to_look(run_dir, sink)
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
        metrics[names.component_summary("first_call_ms")] = stats["first call"]["mean_ms"]
    if "call" in stats:
        for key in ("mean_ms", "p50_ms", "p90_ms", "max_ms"):
            values[f"call {key.removesuffix('_ms')}"] = (stats["call"][key], "ms")
            metrics[names.component_summary(f"call_{key}")] = stats["call"][key]
    note = "Wall time per call including the profiler's overhead in active steps; the device is synchronized."
    return ReportSection.key_values("Component", values, note), metrics
