"""The benchmark harness: what anemoi-profiler costs a training run, against a bare Trainer and Lightning's tools.

    python benchmarks/run.py [--quick] [--device cpu|cuda] [--out results.json]

Sections: step-time overhead (configurations interleaved, ratio to bare), throughput accuracy, MLflow sink
cost on the training thread (sqlite and a slow HTTP server), trace export and size, end-of-run report cost,
HTA analysis time against the number of ranks, the detailed preset end to end, a window's end against torch.profiler
alone (`window_end.py`). Progress goes to stderr; the
tables and the status of each target are printed last; everything measured goes to the JSON file. See
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.pop("MLFLOW_TRACKING_URI", None)

import torch
from configurations import CONFIGURATIONS, SINK_AVAILABLE, Bench, missing
from models import SPECS, quiet_lightning
from render import render
from sections import always_on_cost, overhead, sink_cost, throughput_accuracy
from short_run import short_run
from slow_proxy import MlflowServer
from targets import check_targets
from trace_sections import detailed_preset_check, hta_scaling, trace_and_report_cost
from window_end import window_end

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "traces" / "h200_single_gpu" / "rank-0.pt.trace.json.gz"
SECTIONS = ("overhead", "sink", "trace", "hta", "detailed", "short", "window_end")
H200_BASELINE = {
    "bare_step_ms": 23.96,
    "ThroughputMonitor_ratio": 1.105,
    "source": "tests/fixtures/README.md (H200, 60 measured steps, median of 2 runs)",
}


@dataclass(frozen=True)
class Mode:
    """Sizes of one benchmark run."""

    spec: str
    warmup: int
    measured: int
    repetitions: int
    warm_up: tuple[str, ...]
    sink_measured: int
    hta_ranks: tuple[int, ...]
    hta_time_limit_s: float
    loop_blocks: int
    short_spec: str
    short_repetitions: int
    short_script_repetitions: int


ALL = tuple(CONFIGURATIONS)
# First use of the profiler in a process initialises CUPTI; the first of ours opens the sqlite store.
CUDA_WARM_UP = ("bare", "ours: always-on", "Lightning PyTorchProfiler")
MODES = {
    ("full", "cpu"): Mode("cpu-20ms", 5, 60, 5, ALL, 400, (1, 2, 4, 8), 600, 20, "cpu", 7, 5),
    ("full", "cuda"): Mode("h200", 10, 60, 3, CUDA_WARM_UP, 200, (1, 2, 4, 8), 300, 20, "h200", 3, 1),
    ("quick", "cpu"): Mode("tiny", 3, 20, 1, ("bare", "ours: always-on"), 40, (1,), 120, 3, "tiny", 1, 1),
    ("quick", "cuda"): Mode("h200", 5, 20, 1, ("bare", "ours: always-on"), 40, (1, 2), 120, 3, "h200", 1, 1),
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("benchmarks: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    mode_name = "quick" if args.quick else "full"
    mode = MODES[(mode_name, device)]
    if args.repetitions:
        mode = Mode(**{**asdict(mode), "repetitions": args.repetitions})
    if args.measured:
        mode = Mode(**{**asdict(mode), "measured": args.measured})
    if args.hta_ranks:
        mode = Mode(**{**asdict(mode), "hta_ranks": tuple(int(count) for count in args.hta_ranks.split(","))})
    sections = set(args.sections.split(",")) if args.sections else set(SECTIONS)
    if device == "cpu":
        torch.set_num_threads(args.threads)
    quiet_lightning()
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="anemoi-bench-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(SPECS[mode.spec], device, mode.warmup, mode.measured, work_dir)
    results: dict[str, Any] = {"meta": machine(device, mode_name, mode, bench, args)}
    out = Path(args.out).resolve()
    started = time.monotonic()

    def section(key: str, run: Callable[[], Any]) -> Any:
        progress(f"{key} ...")
        t0 = time.monotonic()
        try:
            value = run()
        except Exception as error:  # one broken section must not lose the others' numbers
            traceback.print_exc()
            value = {"note": f"failed: {type(error).__name__}: {error}"}
        if isinstance(value, dict):
            value.setdefault("seconds", round(time.monotonic() - t0, 1))
        results[key] = value
        write_results(out, results)  # after every section: a run cut short keeps what it measured
        return value

    fits: list[Any] = []
    server = MlflowServer(work_dir / "mlflow_server")
    if "sink" in sections and mode_name == "quick" and SINK_AVAILABLE:
        server.launch()  # quick mode: let it start while the other sections run (their timings do not matter)
    try:
        if "overhead" in sections:

            def run_overhead() -> dict[str, Any]:
                table, done = overhead(bench, mode.repetitions, mode.warm_up, args.configurations)
                fits.extend(done)
                return table

            section("overhead", run_overhead)
        if "detailed" in sections:
            section("detailed_preset", lambda: detailed_preset_check(bench, mode.hta_time_limit_s))
        if "trace" in sections:
            traced = section("trace_cost", lambda: trace_and_report_cost(bench))
            results["report_cost"] = traced.pop("reports", {"note": traced.get("note", "not measured")})
        if "sink" in sections:
            sink_bench = Bench(bench.spec, device, mode.warmup, mode.sink_measured, work_dir)

            def run_sink() -> dict[str, Any]:
                table, done = sink_cost(sink_bench, args.delay_s, server, mode.loop_blocks, args.cprofile_hooks)
                fits.extend(done)
                return table

            section("sink_cost", run_sink)
        if fits:
            section("throughput_accuracy", lambda: throughput_accuracy(fits))
        if "short" in sections:
            section(
                "short_run",
                lambda: short_run(
                    work_dir, mode.short_spec, device, mode.short_repetitions, mode.short_script_repetitions
                ),
            )
        if "window_end" in sections:
            section("window_end", lambda: window_end(work_dir, mode_name, 1 if mode_name == "quick" else 2))
        if "hta" in sections:
            fixture = hta_source(args.fixture)
            section("hta_scaling", lambda: hta_scaling(fixture, mode.hta_ranks, mode.hta_time_limit_s, work_dir))
    finally:
        server.stop()
    results["always_on_cost"] = always_on_cost(results)
    results["meta"]["seconds"] = round(time.monotonic() - started, 1)
    results["meta"]["load_average_end"] = os.getloadavg()
    results["targets"] = check_targets(results)
    write_results(out, results)
    print(render(results))
    print(f"\nresults: {out}\nwork folder: {work_dir}")
    failed = [t for t in results["targets"] if t["status"] == "FAIL"]
    return 1 if args.strict and failed else 0


def write_results(out: Path, results: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".part")
    partial.write_text(json.dumps(results, indent=2, default=str) + "\n")
    partial.replace(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: every code path once or twice (tests)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--out", default="benchmark_results.json", help="JSON file of all results")
    parser.add_argument("--work-dir", help="folder for run folders, traces and stores (default: a new temp dir)")
    parser.add_argument("--sections", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--repetitions", type=int, help="override the mode's repetitions of the overhead table")
    parser.add_argument("--measured", type=int, help="override the mode's measured batches per fit")
    parser.add_argument("--configurations", type=lambda text: text.split(";"), help="';'-separated subset (and bare)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1: less noise)")
    parser.add_argument("--delay-s", type=float, default=0.1, help="delay the proxy adds to every MLflow request")
    parser.add_argument("--fixture", help="trace copied per rank for the HTA section")
    parser.add_argument("--hta-ranks", help="comma-separated rank counts of the HTA section (default: the mode's)")
    parser.add_argument("--cprofile-hooks", action="store_true", help="cProfile our hooks in the sink section")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] benchmarks: {message}", file=sys.stderr, flush=True)


def hta_source(explicit: str | None) -> Path:
    """The H200 trace of the test fixtures (a real GPU trace, the same on every machine), or the one given."""
    return Path(explicit) if explicit else FIXTURE


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "cpu")


def checkout_commit() -> str | None:
    """The commit measured, with "+dirty" when the working tree differs from it: a result names its code."""
    here = Path(__file__).resolve().parent

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=here, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def machine(device: str, mode_name: str, mode: Mode, bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    try:
        import lightning
    except ImportError:  # pragma: no cover - only pytorch_lightning installed
        import pytorch_lightning as lightning

    meta: dict[str, Any] = {
        "command": " ".join(["python benchmarks/run.py", *args.argv]),
        "mode": mode_name,
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_start": os.getloadavg(),
        "model": bench.spec.describe(),
        "sizes": asdict(mode),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
        },
        "missing_optional": missing("mlflow", "hta", "pynvml", "anemoi_profiler", "omegaconf", "torchinfo"),
        "h200_baseline": H200_BASELINE,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": checkout_commit(),
    }
    try:
        import mlflow

        meta["versions"]["mlflow"] = mlflow.__version__
    except ImportError:
        pass
    return meta


if __name__ == "__main__":
    sys.exit(main())
