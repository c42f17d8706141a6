"""A script that fits a short run and exits, as a user's would: `short_run` times it from start to exit.

    python benchmarks/short_run_script.py --spec cpu --device cpu --steps 160 --work-dir DIR [--profiled --store URI]

Bare, it imports torch and Lightning and fits; `--profiled` adds the default callbacks, built just before the
Trainer. It prints the fit's wall time as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import torch
from models import SPECS, make_loader, make_model, make_trainer, quiet_lightning


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--profiled", action="store_true")
    parser.add_argument("--store", help="the profiled run's tracking URI")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as the harness's fits
    quiet_lightning()
    spec = SPECS[args.spec]
    model, loader = make_model(spec, args.device), make_loader(spec, args.steps)
    callbacks = []
    if args.profiled:
        from models import samples_in

        from anemoi_profiler import ProfilerConfig, build_callbacks

        overrides = [f"output_dir={args.work_dir / 'runs'}", f"tracking.uri={args.store}"]
        callbacks = build_callbacks(ProfilerConfig.load(None, overrides), batch_size_fn=samples_in)
    trainer = make_trainer(spec, args.device, args.steps, callbacks)
    started = time.perf_counter()
    trainer.fit(model, loader)
    print(json.dumps({"fit_s": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
