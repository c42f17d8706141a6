"""What a profiling window's end costs the training thread: ours against torch.profiler alone, alternated.

    python benchmarks/window_end.py [--quick] [--repetitions 2] [--out results.json]

(also the `window_end` section of `benchmarks/run.py`). The model is many small operators (`--layers`
Linear(8, 8) + ReLU layers, 4 samples a batch, on CPU), one training window of `--active` steps after
10 skipped, 5 waiting and 2 warmup batches, then `--after` batches. Each fit runs in a fresh child process:

- `ours`: `TorchProfilerCallback` with the profiler's default window options (shapes, memory, traces, window
  summary, time and memory reports), validation off;
- `ours_no_reports`: the same without the time and memory reports (no `key_averages()` at the fit's end);
- `torch`: torch.profiler alone with the same options and schedule, `export_chrome_trace` in `on_trace_ready`
  (torchtitan's way).

Per fit: the window's end (the step of the window's last active batch, from its start to the next batch's
start), the steady step (median of the batches before the window), the longest step among the `--after`
batches after the window and which one it was; for ours, where the end's time went on the training thread
(torch's stop, the trace export, the summary hand-over, the rest) and `end_held_ms` from windows.json; and
the time from the last batch to `fit()` returning (`fit_end_ms`: for ours, the time and memory reports).
Targets (issue 51): end ours / torch <= 1.10; no step after the window longer than max(100 ms, 5x steady).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SKIP, WAIT, WARMUP = 10, 5, 2
FIRST_ACTIVE = SKIP + WAIT + WARMUP
KINDS = ("ours", "torch", "ours_no_reports")
"""ours_no_reports: ours with `profiler.time_report=false profiler.memory_report=false` (no `key_averages()`)."""
SIZES = {"full": {"layers": 150, "active": 100, "after": 60}, "quick": {"layers": 4, "active": 3, "after": 8}}
END_RATIO_TARGET = 1.10
HELD_FLOOR_MS, HELD_STEADY_TIMES = 100.0, 5.0


def window_end(work_dir: Path, mode: str = "full", repetitions: int = 2, timeout_s: float = 900) -> dict[str, Any]:
    """`repetitions` fits of each kind, alternated (ours, torch, torch, ours, ...), each in a child process."""
    sizes = SIZES[mode]
    fits: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for repetition in range(repetitions):
        order = KINDS if repetition % 2 == 0 else KINDS[::-1]
        for kind in order:
            folder = work_dir / "window_end" / f"rep{repetition}_{kind}"
            fits[kind].append(_child(kind, folder, sizes, timeout_s))
    ends = {kind: statistics.median(fit["end_ms"] for fit in fits[kind]) for kind in KINDS}
    result: dict[str, Any] = {"sizes": sizes, "repetitions": repetitions, "fits": dict(fits)}
    result["end_ms_median"] = ends
    result["end_ratio"] = ends["ours"] / ends["torch"]
    result["fit_end_ms_median"] = {kind: statistics.median(fit["fit_end_ms"] for fit in fits[kind]) for kind in KINDS}
    for kind in KINDS:
        bounds = [max(HELD_FLOOR_MS, HELD_STEADY_TIMES * fit["steady_ms"]) for fit in fits[kind]]
        result[f"{kind}_after_max_ms_median"] = statistics.median(fit["after_max_ms"] for fit in fits[kind])
        over_bound = [fit["after_max_ms"] / bound for fit, bound in zip(fits[kind], bounds, strict=True)]
        result[f"{kind}_after_over_bound_max"] = max(over_bound)
        result[f"{kind}_after_within_bound"] = max(over_bound) <= 1.0
    breakdown = defaultdict(list)
    for fit in fits["ours"]:
        for part, ms in fit.get("parts_ms", {}).items():
            breakdown[part].append(ms)
    result["ours_parts_ms_median"] = {part: statistics.median(values) for part, values in breakdown.items()}
    result["targets"] = {
        "end_ratio_at_most": END_RATIO_TARGET,
        "after_step_at_most_ms": f"max({HELD_FLOOR_MS:g}, {HELD_STEADY_TIMES:g} x steady step)",
    }
    return result


def _child(kind: str, folder: Path, sizes: dict[str, int], timeout_s: float) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "fit.json"
    command = [sys.executable, __file__, "--child", kind, "--folder", str(folder)]
    command += [f"--{key}={value}" for key, value in sizes.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, timeout=timeout_s, env=env)
    return json.loads(out.read_text())


# ---------------------------------------------------------------- the child: one fit


class _Parts:
    """Wall time of named calls on the training thread (wrapped class attributes), summed per name."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self._main = threading.get_ident()

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)
        parts = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != parts._main:
                return original(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                parts.ms[name] += (time.perf_counter() - started) * 1000

        setattr(owner, attribute, timed)


def run_child(kind: str, folder: Path, layers: int, active: int, after: int) -> None:
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    batches = FIRST_ACTIVE + active + after + 1
    starts: list[float] = []

    class StepClock(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            starts.append(time.perf_counter())

        def on_train_end(self, *args: Any) -> None:
            starts.append(time.perf_counter())

    class Layers(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*[module for _ in range(layers) for module in (nn.Linear(8, 8), nn.ReLU())])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    parts = _Parts()
    if kind == "torch":
        callback = _torch_alone(folder, active, parts)
    else:
        callback = _ours(folder, active, parts, reports=kind == "ours")
    data = DataLoader(TensorDataset(torch.randn(batches * 4, 8)), batch_size=4)
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[StepClock(), callback],
    )  # fmt: skip
    trainer.fit(Layers(), data)
    fit_end_ms = (time.perf_counter() - starts[-1]) * 1000
    steps_ms = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    last = FIRST_ACTIVE + active - 1
    following = steps_ms[last + 1 : last + 1 + after]
    fit = {
        "kind": kind,
        "end_ms": steps_ms[last],
        "steady_ms": statistics.median(steps_ms[2:SKIP]),
        "window_step_ms_median": statistics.median(steps_ms[FIRST_ACTIVE:last]),
        "after_max_ms": max(following),
        "after_argmax": 1 + following.index(max(following)),
        "after_median_ms": statistics.median(following),
        "parts_ms": dict(parts.ms),
        "fit_end_ms": fit_end_ms,
    }
    if kind != "torch":
        (run_dir,) = [path for path in (folder / "runs").iterdir() if path.is_dir()]
        windows = json.loads((run_dir / "windows.json").read_text())["windows"]
        fit["end_held_ms"] = [entry.get("end_held_ms") for entry in windows]
    (folder / "fit.json").write_text(json.dumps(fit, indent=1))


def _ours(folder: Path, active: int, parts: _Parts, reports: bool = True) -> Any:
    import torch

    from anemoi_profiler import ProfilerConfig
    from anemoi_profiler.callbacks.torch_profiler import TorchProfilerCallback
    from anemoi_profiler.profiling.traces import TraceWriter
    from anemoi_profiler.profiling.window_summarizer import WindowSummaries
    from anemoi_profiler.profiling.windows import ProfilingWindows

    parts.wrap(torch.profiler.profile, "stop_trace", "torch stop")
    parts.wrap(torch.profiler.profile, "export_chrome_trace", "export_chrome_trace")
    parts.wrap(TraceWriter, "write", "trace write (export included)")
    parts.wrap(WindowSummaries, "submit", "summary hand-over")
    parts.wrap(ProfilingWindows, "_on_window", "on_trace_ready (ours, all)")
    parts.wrap(TorchProfilerCallback, "on_train_batch_end", "on_train_batch_end (ours, all batches)")
    config = ProfilerConfig.load(
        None,
        [
            f"output_dir={folder / 'runs'}", "system.enabled=false", "tracking.enabled=false", "report.console=false",
            "profiler.enabled=true", "profiler.validation=false", f"profiler.train.skip_first={SKIP}",
            f"profiler.train.wait={WAIT}", f"profiler.train.warmup={WARMUP}", f"profiler.train.active={active}",
            "profiler.train.repeat=1",
            *(() if reports else ("profiler.time_report=false", "profiler.memory_report=false")),
        ],
    )  # fmt: skip
    return TorchProfilerCallback(config)


def _torch_alone(folder: Path, active: int, parts: _Parts) -> Any:
    import lightning.pytorch as pl
    import torch
    from torch.profiler import ProfilerActivity

    parts.wrap(torch.profiler.profile, "stop_trace", "torch stop")
    parts.wrap(torch.profiler.profile, "export_chrome_trace", "export_chrome_trace")
    trace = folder / "trace.json"

    class TorchAlone(pl.Callback):
        def on_train_start(self, *args: Any) -> None:
            self.profile = torch.profiler.profile(
                activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                schedule=torch.profiler.schedule(skip_first=SKIP, wait=WAIT, warmup=WARMUP, active=active, repeat=1),
                on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace)),
            )  # fmt: skip
            self.profile.__enter__()

        def on_train_batch_end(self, *args: Any) -> None:
            self.profile.step()

        def on_train_end(self, *args: Any) -> None:
            self.profile.__exit__(None, None, None)

    return TorchAlone()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=SIZES["full"]["layers"])
    parser.add_argument("--active", type=int, default=SIZES["full"]["active"])
    parser.add_argument("--after", type=int, default=SIZES["full"]["after"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the code paths once")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--work-dir", help="default: a new temp dir")
    parser.add_argument("--out", default="window_end_results.json")
    args = parser.parse_args()
    if args.child:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        run_child(args.child, Path(args.folder), args.layers, args.active, args.after)
        return 0
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="anemoi-window-end-"))
    started, load = time.monotonic(), os.getloadavg()
    result = window_end(work_dir, "quick" if args.quick else "full", args.repetitions)
    result["meta"] = {
        "command": " ".join(["python", "benchmarks/window_end.py", *sys.argv[1:]]),
        "cpu_count": os.cpu_count(),
        "load_average_start": load,
        "load_average_end": os.getloadavg(),
        "seconds": round(time.monotonic() - started, 1),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("end_ms_median", "end_ratio", "ours_parts_ms_median")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
