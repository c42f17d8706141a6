"""On a CUDA device: what triggered and requested windows cost and make, in real Lightning fits.

    python benchmarks/gpu_triggers_check.py OUT_DIR [--repetitions N]

1. Armed cost: the benchmark model (benchmarks/models.py, the H200 spec) with the simple preset, armed and not,
   beside bare and a bare control, interleaved; step-time medians and ratios to bare of the same repetition.
2. The memory trigger: a fit whose CUDA memory climbs every step gets a `memory` window with a CUDA memory
   snapshot (`memory/snapshot_rank0_window<k>.pickle`) and its evidence in windows.json.
3. A request: `anemoi-profiler request <run folder> --memory` from another process during a fit is served with a
   window and a snapshot.
4. The window summary of a real CUDA window (the detailed preset's schedule): window_summary.json's device fields.
Everything goes to OUT_DIR/triggers.json (and a copy of each windows.json); exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from configurations import Bench, Setup, fit_once, ours  # noqa: E402
from models import SPECS  # noqa: E402

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - only pytorch_lightning installed
    import pytorch_lightning as pl

from anemoi_profiler import ProfilerConfig, build_callbacks  # noqa: E402
from anemoi_profiler.run_files.layout import WINDOWS_FILE, run_folders  # noqa: E402

ARMED = "ours: simple preset, triggers armed"
SIMPLE = "ours: simple preset"
DEVICE = "cuda"
KEEP_TRACES: Path | None = None
NAMES = ("bare", "bare (control)", SIMPLE, ARMED)


def armed_cost(work: Path, repetitions: int) -> dict[str, Any]:
    bench = Bench(SPECS["h200" if DEVICE == "cuda" else "tiny"], DEVICE, 10, 60, work / "armed")
    setups = {
        "bare": lambda folder: Setup(),
        "bare (control)": lambda folder: Setup(),
        SIMPLE: lambda folder: ours(bench, "simple"),
        ARMED: lambda folder: ours(bench, "simple", ["triggers.enabled=true"]),
    }
    for name in ("bare", SIMPLE):  # CUDA context, cuBLAS handles, the first build of our callbacks
        fit_once(bench, name, bench.work_dir / "warm_up" / name.replace(" ", "_"), setups[name](None))
    steps: dict[str, list[float]] = {name: [] for name in NAMES}
    for repetition in range(repetitions):
        order = NAMES[repetition % len(NAMES) :] + NAMES[: repetition % len(NAMES)]
        for name in order:
            folder = bench.work_dir / f"rep{repetition}" / name.replace(" ", "_").replace(",", "").replace(":", "")
            steps[name].append(fit_once(bench, name, folder, setups[name](folder)).step_ms)
    table = {}
    for name in NAMES:
        ratios = [step / bare for step, bare in zip(steps[name], steps["bare"], strict=True)]
        table[name] = {
            "step_ms": steps[name],
            "median_ms": statistics.median(steps[name]),
            "ratio_to_bare_median": statistics.median(ratios),
        }
    armed_over_simple = [a / s for a, s in zip(steps[ARMED], steps[SIMPLE], strict=True)]
    return {
        "repetitions": repetitions,
        "model": "benchmarks/models.py h200 spec",
        "table": table,
        "armed_over_simple_median": statistics.median(armed_over_simple),
        "armed_over_simple": armed_over_simple,
    }


class Hoarder(pl.LightningModule):
    """A small MLP that keeps `hoard_mb` more CUDA memory alive after every step: memory that climbs."""

    def __init__(self, hoard_mb: float = 0.0, request: list[str] | None = None, request_at: int = -1) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
        self.hoard_mb = hoard_mb
        self.hoard: list[torch.Tensor] = []
        self.request = request
        self.request_at = request_at
        self.request_output = ""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.hoard_mb:
            self.hoard.append(torch.ones(int(self.hoard_mb * 2**20 / 4), device=self.device))
        if self.request and self.global_step == self.request_at:
            run_dir = str(self.trainer.callbacks[0].session.run_dir)
            command = [run_dir if part == "RUN_DIR" else part for part in self.request]
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
            self.request_output = done.stdout + done.stderr
        x, y = batch
        time.sleep(0.005)  # a step long enough for the log intervals to mean something
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def loader(steps: int) -> torch.utils.data.DataLoader:
    data = torch.utils.data.TensorDataset(torch.randn(steps * 32, 1024), torch.randn(steps * 32, 1))
    return torch.utils.data.DataLoader(data, batch_size=32)


def fit(work: Path, model: Hoarder, steps: int, overrides: list[str], preset: str | None = None) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    base = [f"output_dir={work}", "tracking.enabled=false", "report.console=false", "system.enabled=false"]
    callbacks = build_callbacks(ProfilerConfig.load(preset, base + overrides))
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator=DEVICE,
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(model, loader(steps))
    (run_dir,) = run_folders(work)
    return run_dir


def snapshot_facts(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"path": str(path), "exists": False}
    with path.open("rb") as handle:
        snapshot = pickle.load(handle)
    traces = snapshot.get("device_traces", [[]])
    return {
        "path": path.name,
        "exists": True,
        "bytes": path.stat().st_size,
        "segments": len(snapshot.get("segments", [])),
        "trace_entries": sum(len(t) for t in traces),
    }


def windows_of(run_dir: Path, out: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / WINDOWS_FILE
    if not path.is_file():
        return []
    return json.loads(path.read_text())["windows"]


TRIGGERS = [
    "triggers.enabled=true",
    "log_every_n_steps=5",
    "throughput.warmup_steps=5",
    "triggers.warmup_intervals=1",
    "triggers.request_poll_s=0.5",
]


def memory_trigger(work: Path, out: Path) -> dict[str, Any]:
    model = Hoarder(hoard_mb=64 if DEVICE == "cuda" else 16)
    run_dir = fit(work / "memory", model, 90, [*TRIGGERS, "triggers.drift=false", "triggers.requests=false"])
    windows = windows_of(run_dir, out, "memory")
    memory = [w for w in windows if w.get("reason") == "memory"]
    result: dict[str, Any] = {"windows": windows}
    if memory:
        result["snapshot"] = snapshot_facts(run_dir / "memory" / f"snapshot_rank0_window{memory[0]['window']}.pickle")
    result["ok"] = bool(memory) and result.get("snapshot", {}).get("exists", False)
    return result


def request(work: Path, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "anemoi_profiler.cli", "request", "RUN_DIR", "--memory", "--steps", "2"]
    model = Hoarder(request=command, request_at=20)
    run_dir = fit(work / "request", model, 80, [*TRIGGERS, "triggers.drift=false", "triggers.memory=false"])
    windows = windows_of(run_dir, out, "request")
    served = [w for w in windows if w.get("reason") == "request"]
    result: dict[str, Any] = {"windows": windows, "request_output": model.request_output}
    if served:
        result["snapshot"] = snapshot_facts(run_dir / "memory" / f"snapshot_rank0_window{served[0]['window']}.pickle")
    result["ok"] = bool(served) and result.get("snapshot", {}).get("exists", False)
    return result


def window_summary(work: Path, out: Path) -> dict[str, Any]:
    schedule = [
        "profiler.train.skip_first=10",
        "profiler.train.wait=1",
        "profiler.train.warmup=1",
        "profiler.train.active=3",
        "profiler.train.repeat=1",
        "hta.enabled=false",
        "memory_snapshot.enabled=false",
        "profiler.memory_timeline=false",
    ]
    run_dir = fit(work / "summary", Hoarder(), 30, schedule, preset="detailed")
    found = sorted(run_dir.glob("window_summaries/*/window_*/window_summary.json"))
    result: dict[str, Any] = {"files": [str(p.relative_to(run_dir)) for p in found]}
    if found:
        (out / "lightning_window_summary.json").write_text(found[0].read_text())
        traces = run_dir / "traces"
        if traces.is_dir() and KEEP_TRACES:  # for the agreement check: the trace beside the in-process summary
            shutil.copytree(traces, KEEP_TRACES, dirs_exist_ok=True)
        result["summary"] = json.loads(found[0].read_text())
    result["ok"] = bool(found)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repetitions", type=int, default=4)
    parser.add_argument("--parts", default="armed,memory,request,summary")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the code paths (no snapshot there)")
    parser.add_argument("--keep-traces", type=Path, help="copy the summary part's traces/ folder here")
    args = parser.parse_args()
    global DEVICE, KEEP_TRACES
    DEVICE, KEEP_TRACES = args.device, args.keep_traces
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    results: dict[str, Any] = {"torch": torch.__version__, "device": device}
    parts = {"armed": armed_cost, "memory": memory_trigger, "request": request, "summary": window_summary}
    with tempfile.TemporaryDirectory() as work:
        for name in args.parts.split(","):
            started = time.perf_counter()
            try:
                if name == "armed":
                    results[name] = parts[name](Path(work), args.repetitions)
                else:
                    results[name] = parts[name](Path(work), args.out)
            except Exception as error:
                results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
                print(f"{name}: {error!r}", file=sys.stderr)
            results[name]["seconds"] = round(time.perf_counter() - started, 1)
            (args.out / "triggers.json").write_text(json.dumps(results, indent=1, default=str))
            print(f"{name}: done in {results[name]['seconds']} s, ok={results[name].get('ok')}", flush=True)
    failed = [name for name in args.parts.split(",") if results[name].get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
