"""What building the callbacks and fitting with them leave behind: no process started by a constructor (Hydra's or
LightningCLI's `instantiate` builds them long before a fit, on every rank), and no hook set on an instance (the
hooks Lightning calls are the classes' own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import psutil
import pytest

from anemoi_profiler import ProfilerConfig, build_callbacks, callbacks
from anemoi_profiler.callbacks.stage_callback import StageCallback
from anemoi_profiler.config import PRESETS
from anemoi_profiler.integrations.anemoi import AnemoiProfiler
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

PUBLIC_CALLBACKS = [
    getattr(callbacks, name)
    for name in callbacks.__all__
    if isinstance(getattr(callbacks, name), type) and issubclass(getattr(callbacks, name), callbacks.ProfilerCallback)
]


def children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("preset", PRESETS)
def test_building_every_callback_from_a_preset_starts_no_process(tmp_path: Path, preset: str) -> None:
    before = children()
    config = ProfilerConfig.load(preset, [f"output_dir={tmp_path}"])
    built: list[Any] = [
        *build_callbacks(config),
        *(callback_class(config) for callback_class in PUBLIC_CALLBACKS),
        *(callback_class(preset) for callback_class in PUBLIC_CALLBACKS),  # a config source, as `init_args` give
        AnemoiProfiler(preset, overrides=[f"output_dir={tmp_path}"]),
    ]
    assert len(built) > 2 * len(PUBLIC_CALLBACKS)
    assert children() == before, "a constructor started a process"
    assert not list(tmp_path.iterdir()), "a constructor wrote to the output folder"


class CallbackListSpy(pl.Callback):
    """Keeps the trainer's callback list as it is during the fit (with the clock callback and the markers)."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if not self.callbacks:
            self.callbacks = list(trainer.callbacks)


@pytest.mark.stack  # how Lightning's dispatcher finds hooks
def test_after_a_fit_no_callback_instance_carries_a_hook_of_its_own(tmp_path: Path) -> None:
    """Every callback of the detailed preset, with a training and a validation profiling window inside the fit."""
    config = ProfilerConfig.load(
        "detailed",
        [
            f"output_dir={tmp_path}",
            "tracking.enabled=false",
            "hta.enabled=false",
            "report.html=false",
            "report.console=false",
            "throughput.warmup_steps=1",
            "log_every_n_steps=2",
            "profiler.train.skip_first=1",
        ],
    )
    built = build_callbacks(config)
    spy = CallbackListSpy()
    train, val = loaders(n_train=160, n_val=64)
    trainer([*built, spy], max_steps=10, val_check_interval=5).fit(TinyRegressor(), train, val)

    in_fit = spy.callbacks
    assert any(isinstance(callback, StageCallback) for callback in in_fit)
    assert {type(callback).__name__ for callback in in_fit} >= {
        "StageClockCallback",
        "TorchProfilerCallback",
        "ModelSummaryCallback",
    }
    assert not [callback for callback in built if callback.disabled]
    run_dir = built[0].session.run_dir
    assert run_dir is not None and list((run_dir / "traces").rglob("*.json*")), "a profiling window was recorded"
    for callback in [*built, *in_fit]:
        hooks = [name for name in vars(callback) if name.startswith("on_")]
        assert not hooks, f"{type(callback).__name__} carries {hooks} on its instance"
