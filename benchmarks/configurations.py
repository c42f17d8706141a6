"""The configurations under test and one timed fit of a configuration.

Every configuration trains the same model on the same data; only the callbacks (or the Trainer's
`profiler=`) differ. Ours come from `build_callbacks(ProfilerConfig.load(preset, overrides))`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from measure import HOOK_NAMES, HookTimer, StepClock, all_children_cpu_s
from models import ModelSpec, make_loader, make_model, make_trainer, samples_in

try:
    from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor, ThroughputMonitor
    from lightning.pytorch.profilers import PyTorchProfiler, SimpleProfiler
except ImportError:  # pragma: no cover - only pytorch_lightning installed
    from pytorch_lightning.callbacks import Callback, DeviceStatsMonitor, ThroughputMonitor
    from pytorch_lightning.profilers import PyTorchProfiler, SimpleProfiler


def missing(*modules: str) -> list[str]:
    """The modules of `modules` that cannot be imported here."""
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(name)
    return absent


OURS_AVAILABLE = not missing("anemoi_profiler", "omegaconf", "torchinfo")
SINK_AVAILABLE = OURS_AVAILABLE and not missing("mlflow", "sqlalchemy", "alembic")


@dataclass(frozen=True)
class Window:
    """One torch.profiler window; the same for our detailed preset and Lightning's PyTorchProfiler."""

    skip_first: int = 10
    wait: int = 2
    warmup: int = 2
    active: int = 3

    @property
    def first_batch(self) -> int:
        return self.skip_first

    @property
    def last_batch(self) -> int:
        """0-based index of the last active batch: the window's trace is exported at its end."""
        return self.skip_first + self.wait + self.warmup + self.active - 1

    def overrides(self) -> list[str]:
        fields = ("skip_first", "wait", "warmup", "active")
        return [f"profiler.train.{name}={getattr(self, name)}" for name in fields] + ["profiler.train.repeat=1"]

    def torch_schedule(self) -> Callable[[int], Any]:
        return torch.profiler.schedule(
            skip_first=self.skip_first, wait=self.wait, warmup=self.warmup, active=self.active, repeat=1
        )


@dataclass
class Bench:
    """What every fit of a benchmark run shares: model, device, step counts and the working folder."""

    spec: ModelSpec
    device: str
    warmup: int
    measured: int
    work_dir: Path
    window: Window = field(default_factory=Window)

    @property
    def total(self) -> int:
        return self.warmup + self.measured

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.work_dir / 'mlflow.db'}"

    def our_overrides(self, tracking_uri: str | None = None) -> list[str]:
        """Settings every one of our configurations gets: where to write, quiet, same warmup as the clock."""
        overrides = [
            f"output_dir={self.work_dir / 'runs'}",
            "report.console=false",
            f"throughput.warmup_steps={self.warmup}",
        ]
        if SINK_AVAILABLE:
            overrides.append(f"tracking.uri={tracking_uri or self.tracking_uri}")
        else:
            overrides.append("tracking.enabled=false")
        return overrides


@dataclass
class Setup:
    """A configuration made ready for one fit."""

    callbacks: list[Any] = field(default_factory=list)
    trainer_options: dict[str, Any] = field(default_factory=dict)
    ours: list[Any] = field(default_factory=list)


# Always-on set, logging often enough that the sink and the system sampler work during the measured steps.
ALWAYS_ON_BUSY = ["log_every_n_steps=10", "system.interval_s=1", "tracking.flush_interval_s=1"]


def without_end_of_run_hta() -> list[str]:
    """The detailed preset's HTA runs after the fit, outside the measured steps: skip it where only step
    time counts (it has its own section). Older configs have no `hta` key."""
    from anemoi_profiler import ProfilerConfig

    return ["hta.enabled=false"] if hasattr(ProfilerConfig(), "hta") else []


def ours(bench: Bench, preset: str, extra: list[str] | None = None, tracking_uri: str | None = None) -> Setup:
    from anemoi_profiler import ProfilerConfig, build_callbacks

    overrides = bench.our_overrides(tracking_uri) + (extra or [])
    if preset == "detailed":
        overrides += bench.window.overrides()
    callbacks = build_callbacks(ProfilerConfig.load(preset, overrides), batch_size_fn=samples_in)
    return Setup(callbacks=list(callbacks), ours=list(callbacks))


def lightning_pytorch_profiler(bench: Bench, folder: Path) -> Setup:
    profiler = PyTorchProfiler(
        dirpath=str(folder),
        filename="lightning",
        schedule=bench.window.torch_schedule(),
        record_shapes=True,
        profile_memory=True,
    )
    return Setup(trainer_options={"profiler": profiler})


CONFIGURATIONS: dict[str, Callable[[Bench, Path], Setup]] = {
    "bare": lambda bench, folder: Setup(),
    "bare (control)": lambda bench, folder: Setup(),
    "ours: always-on": lambda bench, folder: ours(bench, "simple", ALWAYS_ON_BUSY),
    "ours: simple preset": lambda bench, folder: ours(bench, "simple"),
    "ours: detailed preset": lambda bench, folder: ours(bench, "detailed", without_end_of_run_hta()),
    "ours: simple preset, triggers armed": lambda bench, folder: ours(bench, "simple", ["triggers.enabled=true"]),
    "Lightning ThroughputMonitor": lambda bench, folder: Setup([ThroughputMonitor(batch_size_fn=samples_in)]),
    "Lightning DeviceStatsMonitor": lambda bench, folder: Setup([DeviceStatsMonitor()]),
    "Lightning SimpleProfiler": lambda bench, folder: Setup(
        trainer_options={"profiler": SimpleProfiler(dirpath=str(folder), filename="simple")}
    ),
    "Lightning PyTorchProfiler": lightning_pytorch_profiler,
}
OUR_CONFIGURATIONS = tuple(name for name in CONFIGURATIONS if name.startswith("ours"))


@dataclass
class FitResult:
    name: str
    step_ms: float
    measured_batches: int
    independent_samples_per_sec: float
    step_times_ms: list[float]
    run_dir: Path | None = None
    hooks: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def reported_samples_per_sec(self) -> float | None:
        """Our `summary/train/samples_per_sec`, as written to report.json in the run folder."""
        if self.run_dir is None or not (self.run_dir / "report.json").is_file():
            return None
        report = json.loads((self.run_dir / "report.json").read_text())
        data = report.get("sections", {}).get("Throughput", {}).get("data", {})
        value = data.get("train/samples_per_sec")
        return float(value) if value is not None else None


def fit_once(
    bench: Bench,
    name: str,
    folder: Path,
    setup: Setup | None = None,
    time_hooks: bool = False,
    cprofile_hooks: bool = False,
) -> FitResult:
    """Train `bench.total` batches with configuration `name` (or a ready `setup`) and time the steady state."""
    folder.mkdir(parents=True, exist_ok=True)
    setup = setup or CONFIGURATIONS[name](bench, folder)
    children_before = all_children_cpu_s()
    clock = StepClock(bench.warmup, bench.total, sync_cuda=bench.device == "cuda")
    timer = floor = None
    timed: list[Any] = []
    if time_hooks:
        # The same timer on do-nothing callbacks with the same hooks: what timing a hook call costs by itself.
        no_ops = [_do_nothing_like(callback) for callback in setup.ours]
        timer, floor = HookTimer(setup.ours, cprofile=cprofile_hooks), HookTimer(no_ops)
        timed = [timer.boundary, floor.boundary, *no_ops]
    callbacks = [*timed, *setup.callbacks, clock]
    trainer = make_trainer(bench.spec, bench.device, bench.total, callbacks, **setup.trainer_options)
    model = make_model(bench.spec, bench.device)
    loader = make_loader(bench.spec, bench.total)
    with (folder / "fit.log").open("a") as log, contextlib.redirect_stdout(log):
        trainer.fit(model, loader)
    fit_ended = time.perf_counter()
    if setup.ours:
        from anemoi_profiler import wait_for_mlflow

        # What a fit left to the background: its sender's CPU counts below, and no later fit shares the CPU with it.
        wait_for_mlflow(timeout_s=120.0)
    children_cpu_s = all_children_cpu_s() - children_before  # the MLflow sender, ended
    run_dir = setup.ours[0].session.run_dir if setup.ours else None
    result = FitResult(
        name=name,
        step_ms=clock.step_ms,
        measured_batches=clock.measured_batches,
        independent_samples_per_sec=bench.spec.batch_size * clock.measured_batches / clock.elapsed_s,
        step_times_ms=clock.step_times_ms(),
        run_dir=run_dir,
        hooks=hook_summary(timer, floor, bench.warmup) if timer and floor else None,
        extras={
            "end_of_fit_s": fit_ended - clock.batch_ends[-1],
            "best_step_ms": clock.best_step_ms(),
            "step_cpu_times_ms": clock.step_cpu_times_ms(),
            "thread_cpu_us_per_batch": {
                name: seconds * 1e6 / clock.measured_batches for name, seconds in clock.background_cpu_s.items()
            },
            "child_process_cpu_s": children_cpu_s,
        },
    )
    if timer and cprofile_hooks:
        result.extras["cprofile"] = timer.cprofile_top()
    del trainer, model, loader
    release_memory(bench.device)
    return result


def _do_nothing_like(callback: Any) -> Callback:
    """A callback with no work in its hooks and the same hooks left for Lightning to call as `callback`."""
    empty = Callback()
    for name in HOOK_NAMES:
        if not callable(getattr(callback, name)):
            setattr(empty, name, None)
    return empty


def hook_summary(timer: HookTimer, floor: HookTimer, warmup: int) -> dict[str, Any]:
    """Our hooks' time per batch, the timer's own floor, and the mean net of that floor."""
    ours, empty = timer.summary(warmup), floor.summary(warmup)
    if not ours["batches"]:
        return ours
    ours["timer_floor_us"] = {"wall_mean": empty["wall_us"]["mean"], "cpu_mean": empty["cpu_us"]["mean"]}
    ours["net_wall_mean_us"] = ours["wall_us"]["mean"] - empty["wall_us"]["mean"]
    ours["net_cpu_mean_us"] = ours["cpu_us"]["mean"] - empty["cpu_us"]["mean"]
    return ours


def release_memory(device: str) -> None:
    """Free the last fit's device memory (on CPU nothing: a full collection of this heap takes a second)."""
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
