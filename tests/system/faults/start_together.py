"""A short profiled job for the same-second test: `python start_together.py <output_dir> <sync_dir> <batches>`.

It imports everything, says so with `<sync_dir>/ready-<batches>`, then waits for `<sync_dir>/go`, which holds
a wall-clock start time and a run folder time stamp. Both jobs start training at that instant and name their
run folders with that stamp, so they collide on the folder name and race on the shared MLflow store, as two
jobs of a job array do. It prints its run folder's name and its steps as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anemoi_profiler.run_files.layout
from anemoi_profiler import ProfilerConfig, build_callbacks
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


class PinnedClock:
    """The `time` module, except that `strftime` always gives the stamp both jobs agreed on."""

    def __init__(self, stamp: str) -> None:
        self.stamp = stamp

    def strftime(self, format: str, *args: Any) -> str:
        return self.stamp

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def main(output_dir: str, sync_dir: str, batches: str) -> None:
    config = ProfilerConfig.load(
        None,
        [f"output_dir={output_dir}", "log_every_n_steps=2", "throughput.warmup_steps=0", "report.console=false"],
    )
    callbacks = build_callbacks(config)
    (Path(sync_dir) / f"ready-{batches}").touch()
    go = Path(sync_dir) / "go"
    while not go.exists():
        time.sleep(0.01)
    plan = json.loads(go.read_text())
    anemoi_profiler.run_files.layout.time = PinnedClock(plan["stamp"])  # type: ignore[assignment]
    time.sleep(max(0.0, plan["start_at"] - time.time()))
    train, _ = loaders(n_train=16 * int(batches))
    fit = trainer(callbacks)
    fit.fit(TinyRegressor(), train)
    print(json.dumps({"run_folder": callbacks[0].session.run_dir.name, "steps": fit.global_step}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
