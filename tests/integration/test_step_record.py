"""`steps.json`: every measured step's duration, compact, with the steps that are not steady state flagged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from lightning.pytorch.callbacks import ModelCheckpoint

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.run_files.layout import STEPS_FILE, run_folders
from anemoi_profiler.run_files.steps_file import (
    AFTER_OTHER_STAGE,
    CHECKPOINT,
    EPOCH_START,
    NOT_STEADY,
    PROFILED,
    QUANTUM,
    WARMUP,
    decode,
    encode,
    read_steps,
)
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


def test_durations_come_back_within_the_quantum_and_flags_exactly() -> None:
    rng = np.random.default_rng(0)
    seconds = 0.1 * np.exp(rng.normal(0, 0.03, 1000))
    seconds[[3, 500]] = [20.0, 1e-5]  # a checkpoint save, a step that took almost nothing
    flags = rng.integers(0, 32, 1000).astype(np.uint8)
    series = decode(encode(seconds, flags))
    assert np.max(np.abs(series.seconds / seconds - 1)) <= QUANTUM / 2 + 1e-12
    assert np.array_equal(series.flags, flags)
    assert np.array_equal(series.steady(), series.seconds[(flags & NOT_STEADY) == 0])
    assert np.array_equal(series.steady(), series.seconds[(flags | CHECKPOINT) == CHECKPOINT])  # a checkpoint stays


def test_ten_thousand_steps_at_three_percent_noise_take_about_ten_kb() -> None:
    rng = np.random.default_rng(1)
    seconds = 0.25 * np.exp(rng.normal(0, 0.03, 10_000))
    stage = encode(seconds, np.zeros(10_000, dtype=np.uint8))
    stored = len(stage["durations"]) + len(stage["flags"])  # base64 characters, as in the file
    assert stored < 14_000, stored


def test_a_fit_records_each_step_and_flags_warmup_windows_validation_and_checkpoints(tmp_path: Path) -> None:
    overrides = [
        f"output_dir={tmp_path / 'out'}",
        "tracking.enabled=false",
        "report.console=false",
        "system.enabled=false",
        "throughput.warmup_steps=3",
        "profiler.enabled=true",
        "profiler.validation=false",
        "profiler.train.skip_first=5",
        "profiler.train.wait=0",
        "profiler.train.warmup=1",
        "profiler.train.active=2",
    ]
    config = ProfilerConfig.load(None, overrides)
    train, val = loaders(n_train=320)  # 20 batches a epoch
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=12, save_top_k=-1)
    fit = trainer(
        [*build_callbacks(config), checkpoints], max_epochs=2, val_check_interval=10, enable_checkpointing=True
    )
    fit.fit(TinyRegressor(), train, val)
    (run_dir,) = run_folders(tmp_path / "out")
    assert (run_dir / STEPS_FILE).is_file()
    steps = read_steps(run_dir)
    train_steps, val_steps = steps["train"], steps["val"]
    assert len(train_steps.seconds) == 40 and len(val_steps.seconds) == 4 * 4  # 4 validations of 4 batches
    assert np.all(train_steps.seconds > 0) and np.all(val_steps.seconds > 0)
    flags = train_steps.flags
    assert list(np.nonzero(flags & WARMUP)[0]) == [0, 1, 2]
    assert list(np.nonzero(flags & PROFILED)[0]) == [5, 6, 7]  # the window's warmup and active steps
    # The first training step after each validation (after steps 10, 20, 30, 40) and after the train start
    after = [int(i) for i in np.nonzero(flags & AFTER_OTHER_STAGE)[0]]
    assert after == [0, 10, 20, 30]
    # Saved at the end of steps 12, 24, 36, after the clock's hook: the time is in the step that follows
    assert list(np.nonzero(flags & CHECKPOINT)[0]) == [12, 24, 36]
    assert list(np.nonzero(flags & EPOCH_START)[0]) == [0, 20]  # 20 batches an epoch
    assert np.count_nonzero(flags == 0) >= 25  # the steady steps `compare` tests
    assert list(np.nonzero(val_steps.flags & AFTER_OTHER_STAGE)[0]) == [0, 4, 8, 12]
