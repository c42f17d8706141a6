"""The benchmark harness: what anemoi-profiler costs a training run, against a bare Trainer and Lightning's tools.

    python benchmarks/run.py [--quick] [--device cpu|cuda] [--out results.json]

Sections: step-time overhead (configurations interleaved, ratio to bare), throughput accuracy, MLflow sink
cost on the training thread (sqlite and a slow HTTP server), trace export and size, end-of-run report cost,
HTA analysis time against the number of ranks, the detailed preset end to end. Progress goes to stderr; the
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
from sections import (
    always_on_cost,
    detailed_preset_check,
    hta_scaling,
    overhead,
    sink_cost,
    throughput_accuracy,
    trace_and_report_cost,
)
from short_run import CONTROL_LIMIT_PCT, short_run
from slow_proxy import MlflowServer

REPO = Path(__file__).resolve().parents[1]
FIXTURE_NAME = Path("fixtures/traces/h200_single_gpu/rank-0.pt.trace.json.gz")
FIXTURE_CANDIDATES = (REPO.parent / "shared" / FIXTURE_NAME, REPO / "shared" / FIXTURE_NAME)
SECTIONS = ("overhead", "sink", "trace", "hta", "detailed", "short")
H200_BASELINE = {
    "bare_step_ms": 23.96,
    "ThroughputMonitor_ratio": 1.105,
    "source": "shared/fixtures/README.md (H200, 60 measured steps, median of 2 runs)",
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
    short_specs: tuple[str, str]
    short_repetitions: int
    short_script_repetitions: int


ALL = tuple(CONFIGURATIONS)
# First use of the profiler in a process initialises CUPTI; the first of ours opens the sqlite store.
CUDA_WARM_UP = ("bare", "ours: always-on", "Lightning PyTorchProfiler")
MODES = {
    ("full", "cpu"): Mode("cpu", 5, 60, 5, ALL, 400, (1, 2, 4, 8), 600, 20, ("cpu-5ms", "cpu"), 15, 5),
    ("full", "cuda"): Mode("h200", 10, 60, 3, CUDA_WARM_UP, 200, (1, 2, 4, 8), 300, 20, ("h200", "h200"), 3, 1),
    ("quick", "cpu"): Mode("tiny", 3, 20, 1, ("bare", "ours: always-on"), 40, (1,), 120, 3, ("tiny", "tiny"), 1, 1),
    ("quick", "cuda"): Mode("h200", 5, 20, 1, ("bare", "ours: always-on"), 40, (1, 2), 120, 3, ("h200", "h200"), 1, 1),
}

CONTENTION = 2.0
"""The timer's wall time over its CPU time on no-op hooks above which the machine is too busy to time hooks."""


def hooks_noise(store: str) -> Callable[[dict[str, Any], float], str | None]:
    """Why the in-fit hook timing of `store` cannot resolve the target, if it cannot."""

    def reason(results: dict[str, Any], threshold: float) -> str | None:
        floor = results["sink_cost"][store]["hooks"]["timer_floor_us"]
        if floor["wall_mean"] > CONTENTION * floor["cpu_mean"]:
            return (
                f"machine too busy: no-op hooks took {floor['wall_mean']:.0f} us wall for {floor['cpu_mean']:.0f} us "
                "CPU; see the CPU and tight-loop figures"
            )
        return None

    return reason


def overhead_noise(results: dict[str, Any], threshold: float) -> str | None:
    """A bare Trainer against itself should give 1.000; when it strays further than the target, the target
    is not resolved by whole fits on this machine."""
    control = results["overhead"]["configurations"].get("bare (control)")
    if control is None:
        return None
    spread = control["ratio_to_bare"]
    if max(abs(spread["min"] - 1), abs(spread["max"] - 1)) * 100 > threshold:
        return (
            f"bare against bare gave ratios {spread['min']:.3f}-{spread['max']:.3f}: whole fits cannot resolve "
            f"{threshold:g}% here; see the always-on cost target"
        )
    return None


def short_run_noise(results: dict[str, Any], threshold: float) -> str | None:
    """The early-steps figure counts only when its bare-vs-bare control stayed within 1 %."""
    section = results["short_run"]
    if section["control_within_limit"]:
        return None
    attempts = ", ".join(f"{pct:+.1f}" for pct in section["attempts"])
    return f"bare against bare strayed beyond {CONTROL_LIMIT_PCT:g}% in every attempt ({attempts} %): not counted"


def outside_windows_excess(results: dict[str, Any]) -> float:
    """How far (percentage points) the detailed preset's steps outside its windows stray from the always-on
    set's beyond what the bare-vs-bare control strayed: <= 0 is within noise."""
    section = results["overhead"]["outside_windows"]
    ratio = section["ratio_to_always_on"]["median"]
    return (abs(ratio - 1) - section["noise"]) * 100


@dataclass(frozen=True)
class Target:
    key: str
    what: str
    comparison: str
    threshold: float
    locate: Callable[[dict[str, Any]], Any]
    noise: Callable[[dict[str, Any], float], str | None] | None = None
    cuda_threshold: float | None = None  # when the target is tighter on a GPU


TARGETS = [
    Target(
        "hooks_sqlite_us",
        "our hooks per step, sqlite store (wall mean net of timer, us)",
        "<=",
        50.0,
        lambda r: r["sink_cost"]["sqlite"]["hooks"]["net_wall_mean_us"],
        hooks_noise("sqlite"),
    ),
    Target(
        "hooks_slow_server_us",
        "our hooks per step, server +100 ms per request (wall mean net of timer, us)",
        "<=",
        50.0,
        lambda r: r["sink_cost"]["slow_server"]["hooks"]["net_wall_mean_us"],
        hooks_noise("slow_server"),
    ),
    Target(
        "slow_server_longest_batch_ms",
        "longest batch of hook calls with the slow server: no hook waits for it (ms)",
        "<",
        100.0,
        lambda r: r["sink_cost"]["slow_server"]["hooks"]["wall_us"]["max"] / 1000,
    ),
    Target(
        "trace_size_ratio",
        "trace size, Lightning JSON / our gzip (x)",
        ">=",
        10.0,
        lambda r: r["trace_cost"]["size_ratio_lightning_json_to_ours_gz"],
    ),
    Target(
        "throughput_error_pct",
        "samples/s reported vs independent count, long runs (max |error| %)",
        "<=",
        1.0,
        lambda r: r["throughput_accuracy"]["long_runs_max_abs_error_pct"],
    ),
    Target(
        "always_on_cost_pct",
        "always-on set as shipped: training-thread cost + background CPU per step, over a bare step (%)",
        "<=",
        1.0,
        lambda r: r["always_on_cost"]["shipped"]["overhead_pct"],
        cuda_threshold=0.5,
    ),
    Target(
        "always_on_overhead_pct",
        "always-on set, whole fits against bare fits (median step-time overhead %)",
        "<=",
        1.0,
        lambda r: (r["overhead"]["configurations"]["ours: always-on"]["ratio_to_bare"]["median"] - 1) * 100,
        overhead_noise,
        cuda_threshold=0.5,
    ),
    Target(
        "short_run_early_steps_pct",
        "short run, batches 40-160 of 160 (early-steps model), default callbacks vs bare (median overhead %)",
        "<=",
        1.0,
        lambda r: r["short_run"]["early_steps"]["overhead_pct"],
        short_run_noise,
    ),
    Target(
        "short_run_fit_extra_s",
        "short run: fit() wall time (end model), default callbacks minus bare (s)",
        "<=",
        1.0,
        lambda r: r["short_run"]["fit"]["extra_s"],
    ),
    Target(
        "short_run_script_extra_s",
        "short run: a script that fits (end model) and exits, default callbacks minus bare (s)",
        "<=",
        2.0,
        lambda r: r["short_run"]["script"]["extra_s"],
    ),
    Target(
        "outside_windows_excess_pp",
        "detailed preset outside its windows vs always-on: |median ratio - 1| beyond the control's (pp)",
        "<=",
        0.0,
        outside_windows_excess,
    ),
]


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
                    work_dir, mode.short_specs, device, mode.short_repetitions, mode.short_script_repetitions
                ),
            )
        if "hta" in sections:
            fixture = hta_source(args.fixture, results)
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


def hta_source(explicit: str | None, results: dict[str, Any]) -> Path:
    """The H200 fixture when shared/ is beside or inside the checkout, else the CUDA trace this run wrote."""
    if explicit:
        return Path(explicit)
    for candidate in FIXTURE_CANDIDATES:
        if candidate.is_file():
            return candidate
    written = results.get("trace_cost", {}).get("ours", {}).get("path")
    return Path(written) if written and results["meta"]["device"] == "cuda" else FIXTURE_CANDIDATES[0]


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


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """PASS or FAIL per target; SKIP when not measured; NOISY when the measurement's own control says the
    machine was too busy to resolve it (the value is still given)."""
    checked = []
    cuda = results["meta"]["device"] == "cuda"
    for target in TARGETS:
        threshold = target.cuda_threshold if cuda and target.cuda_threshold is not None else target.threshold
        row: dict[str, Any] = {"target": target.key, "what": target.what}
        row["threshold"] = f"{target.comparison} {threshold:g}"
        try:
            value = float(target.locate(results))
        except (KeyError, TypeError, ValueError):
            checked.append({**row, "value": None, "status": "SKIP"})
            continue
        passed = {"<=": value <= threshold, "<": value < threshold, ">=": value >= threshold}
        row.update(value=value, status="PASS" if passed[target.comparison] else "FAIL")
        try:
            noise = target.noise(results, threshold) if target.noise else None
        except (KeyError, TypeError):
            noise = None
        if noise:
            row.update(status="NOISY", note=noise)
        checked.append(row)
    return checked


# ---------------------------------------------------------------- rendering


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "",
        f"anemoi-profiler benchmarks ({meta['mode']}) on {meta['device']} ({meta['device_name']}), "
        f"{meta['cpu_count']} CPUs, load average {fmt_load(meta['load_average_start'])} at start, "
        f"{fmt_load(meta['load_average_end'])} at end",
        f"model: {meta['model']}",
    ]
    lines += render_overhead(results.get("overhead"))
    lines += render_throughput(results.get("throughput_accuracy"))
    lines += render_sink(results.get("sink_cost"))
    lines += render_cost(results.get("always_on_cost"))
    lines += render_trace(results.get("trace_cost"), results.get("report_cost"))
    lines += render_hta(results.get("hta_scaling"))
    lines += render_detailed(results.get("detailed_preset"))
    lines += render_short_run(results.get("short_run"))
    lines += ["", "Targets"]
    for target in results["targets"]:
        value = "n/a" if target["value"] is None else f"{target['value']:.3g}"
        note = f"\n         {target['note']}" if target.get("note") else ""
        lines.append(f"  {target['status']:<5} {target['what']}: {value} (target {target['threshold']}){note}")
    return "\n".join(lines)


def render_overhead(section: dict[str, Any] | None) -> list[str]:
    if not section or "configurations" not in section:
        return note_lines("Step-time overhead", section)
    lines = [
        "",
        f"Step-time overhead: {section['measured_batches']} steady-state batches after {section['warmup_batches']}, "
        f"{section['repetitions']} repetitions interleaved; median [min-max]",
        f"  {'configuration':<30} {'step ms':>22} {'ratio to bare':>24}   {'quickest 10 ms':>14}",
    ]
    for name, row in section["configurations"].items():
        step, ratio = row["step_ms"], row["ratio_to_bare"]
        lines.append(
            f"  {name:<30} {step['median']:>8.3f} [{step['min']:.3f}-{step['max']:.3f}]"
            f" {ratio['median']:>8.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}] {(ratio['median'] - 1) * 100:+6.1f}%"
            f" {row['best_step_ms']['median']:>10.3f}"
        )
    outside = section.get("outside_windows")
    if outside:
        ratio = outside["ratio_to_always_on"]
        lines.append(
            f"  detailed preset outside its window vs always-on (median batch): {ratio['median']:.3f} "
            f"[{ratio['min']:.3f}-{ratio['max']:.3f}]; bare vs bare strayed up to {outside['noise'] * 100:.1f}%"
        )
    lines += [f"  note: {note}" for note in section.get("notes", [])]
    return lines


def render_throughput(section: dict[str, Any] | None) -> list[str]:
    if not section or not section.get("runs"):
        return note_lines("Throughput accuracy", section)
    lines = ["", "Throughput accuracy: summary/train/samples_per_sec (report.json) vs samples / wall time"]
    for row in section["runs"]:
        lines.append(
            f"  {row['configuration']:<22} {row['measured_batches']:>4} batches: reported {row['reported']:>10,.1f}/s"
            f"  independent {row['independent']:>10,.1f}/s  error {row['error_pct']:+.3f}%"
        )
    return lines


def render_sink(section: dict[str, Any] | None) -> list[str]:
    if not section or "sqlite" not in section:
        return note_lines("MLflow sink cost", section)
    lines = [
        "",
        f"MLflow sink cost on the training thread: always-on set, logging every {section['log_every_n_steps']} "
        f"batches, sending every {section['flush_interval_s']} s; our hooks' time per batch in us "
        "(wall: mean median p99 max; CPU: mean; net = mean minus the timer's own cost)",
        f"  {'store':<30} {'mean':>7} {'median':>7} {'p99':>7} {'max':>8} {'CPU':>6} {'net':>6} {'step ms':>8}"
        "  delivered  end of fit",
    ]
    for key, label in (("sqlite", "local sqlite"), ("slow_server", f"mlflow server +{section['delay_s']:g} s/request")):
        row = section.get(key) or {}
        hooks = row.get("hooks")
        if not hooks or not hooks.get("batches"):
            lines.append(f"  {label:<30} {row.get('note', 'not measured')}")
            continue
        wall, cpu = hooks["wall_us"], hooks["cpu_us"]
        delivered = f"{row['probe_points_delivered']}/{row['probe_points_expected']}"
        lines.append(
            f"  {label:<30} {wall['mean']:>7.1f} {wall['median']:>7.1f} {wall['p99']:>7.1f} {wall['max']:>8.1f} "
            f"{cpu['mean']:>6.1f} {hooks['net_wall_mean_us']:>6.1f} {row['step_ms']:>8.3f}  {delivered:>9}  "
            f"{row['end_of_fit_s']:>8.2f} s"
        )
    floor = (section.get("sqlite") or {}).get("hooks", {}).get("timer_floor_us")
    if floor:
        lines.append(
            f"  timer's own cost per batch (as many no-op callbacks): {floor['wall_mean']:.1f} us wall, "
            f"{floor['cpu_mean']:.1f} us CPU"
        )
    for key, label in (("sqlite", "sqlite"), ("slow_server", "slow server")):
        loop = (section.get(key) or {}).get("hook_loop") or {}
        if loop.get("blocks"):
            lines.append(
                f"  hook calls in a tight loop ({label}, {loop['blocks']} blocks of {loop['batches_per_block']} "
                f"batches): best {loop['best_us']:.1f} us, median {loop['median_us']:.1f} us per batch"
            )
    return lines


def render_cost(section: dict[str, Any] | None) -> list[str]:
    if not section or "shipped" not in section:
        return note_lines("Always-on cost per step", section)
    lines = [
        "",
        "Always-on cost per step, each part a ratio of times taken a moment apart (see docs/benchmarks.md)",
        f"  {'set':<10} {'hooks us':>9} {'bare step us':>13} {'hooks %':>8} {'threads %':>10} {'total %':>8}"
        f"  {'MLflow sender CPU per fit (other core)':>40}",
    ]
    for name, row in section.items():
        lines.append(
            f"  {name:<10} {row['training_thread_us']:>9.1f} {row['bare_step_us']:>13.1f} "
            f"{row['training_thread_pct']:>8.2f} {row['background_threads_pct']:>10.2f} {row['overhead_pct']:>8.2f}"
            f"  {row['sender_process_cpu_s_per_fit']:>38.1f} s"
        )
    return lines


def render_trace(section: dict[str, Any] | None, reports: dict[str, Any] | None) -> list[str]:
    if not section or "ours" not in section:
        return note_lines("Trace cost", section)
    window = section["window"]
    lines = [
        "",
        f"Trace of one window ({window['active']} active steps, batches {window['first_batch']}-"
        f"{window['last_batch']}, record_shapes + profile_memory)",
        f"  {'':<12} {'file MB':>8} {'JSON MB':>8} {'window extra ms':>16} {'slowest step ms':>16} {'median ms':>10}",
    ]
    for key, label in (("ours", "ours (gzip)"), ("lightning", "Lightning")):
        row = section[key]
        file_mb = row.get("trace_gz_bytes", row.get("trace_json_bytes", 0)) / 1e6
        json_mb = row.get("trace_json_bytes", 0) / 1e6
        lines.append(
            f"  {label:<12} {file_mb:>8.2f} {json_mb:>8.2f} {row['window_extra_ms']:>16.1f} "
            f"{row['slowest_window_step_ms']:>16.1f} {row['median_step_ms']:>10.3f}"
        )
    if "size_ratio_lightning_json_to_ours_gz" in section:
        lines.append(
            f"  Lightning's JSON is {section['size_ratio_lightning_json_to_ours_gz']:.1f}x our file; our background "
            f"gzip of that JSON took {section['gzip_of_lightning_trace_s']:.2f} s"
        )
    if section.get("note"):
        lines.append(f"  note: {section['note']}")
    if reports and reports.get("build_reports_s") is not None:
        lines.append(
            f"End-of-run reports from that window: build {reports['build_reports_s'] * 1000:.0f} ms, "
            f"report.txt/json {(reports.get('write_report_s') or 0) * 1000:.0f} ms ({', '.join(reports['files'])})"
        )
    return lines


def render_hta(section: dict[str, Any] | None) -> list[str]:
    if not section or not section.get("runs"):
        return note_lines("HTA analysis time", section)
    lines = ["", f"HTA analysis time vs ranks (copies of {Path(section['fixture']).name})"]
    for row in section["runs"]:
        failed = f", failed: {', '.join(row['failed'])}" if row["failed"] else ""
        load = row["load_traces_s"]
        subset = f", {row['analysed']} analysed" if row.get("analysed", row["ranks"]) != row["ranks"] else ""
        memory = f", peak {row['peak_rss_mb']:.0f} MB" if row.get("peak_rss_mb") else ""
        lines.append(
            f"  {row['ranks']:>2} rank(s){subset}: {row['seconds']:6.1f} s (loading "
            f"{load if load is not None else 'n/a'} s{memory}), ran {len(row['ran'])} analyses{failed}"
        )
    return lines


def render_detailed(section: dict[str, Any] | None) -> list[str]:
    if not section or "files" not in section:
        return note_lines("Detailed preset", section)
    lines = ["", f"Detailed preset end to end ({section['step_ms']:.2f} ms/step over the measured steps)"]
    for key, value in section["files"].items():
        size = value if isinstance(value, str) else f"{value['bytes'] / 1e6:.2f} MB"
        lines.append(f"  {key:<16} {size}")
    memory = section.get("memory_report") or {}
    if memory.get("profiled_steps"):
        totals = memory["profiled_steps"]
        lines.append(f"  profiled steps: peak allocated {totals.get('peak_allocated_mb', 0):.0f} MB")
    metrics = section.get("system_metrics") or {}
    lines.append(f"  system metrics: {metrics.get('keys', 0)} keys, NVML {metrics.get('nvml', metrics.get('note'))}")
    energy = ", ".join(f"{key.rsplit('/', 1)[-1]} {value:.4g}" for key, value in metrics.get("energy", {}).items())
    lines.append(f"  energy: {energy or 'none (no GPU energy counter read)'}")
    hta = section.get("hta") or {}
    for window in hta.get("windows", []):
        failed = f", FAILED {', '.join(window['failed'])}" if window["failed"] else ""
        lines.append(f"  HTA {window['window'] or 'traces'}: ran {', '.join(window['ran']) or 'nothing'}{failed}")
        if not window["ran"] and window["skipped"]:
            lines.append(f"    ({next(iter(window['skipped'].values()))})")
    if hta.get("note"):
        lines.append(f"  HTA: {hta['note']}")
    return lines


def _fresh_script_lines(fresh: dict[str, Any] | None) -> list[str]:
    """A fresh script's early steps against a bare script's, the sender started with the callbacks or first thing."""
    if not fresh:
        return []

    def pct(kind: str) -> str:
        value = fresh["early_pct"].get(kind)
        return "n/a" if value is None else f"{value:+.2f} %"

    scripts = len(fresh["runs_s"]["bare"])
    return [
        f"  a fresh script's early steps ({fresh['spec']}, {scripts} scripts each): ours {pct('ours')}, the MLflow "
        f"client started first thing {pct('ours (sender started first)')} (bare vs bare {pct('bare (control)')})",
    ]


def render_short_run(section: dict[str, Any] | None) -> list[str]:
    if not section or "early_steps" not in section:
        return note_lines("Short run", section)
    lines = ["", f"Short run ({section['steps']} steps, {section['repetitions']} interleaved repetitions)"]
    window = f"batches {section['early_window'][0]}-{section['early_window'][1]}"
    names = {"early_steps_set": "early-steps model", "end_set": "end model"}
    sets = {key: section[key] for key in names if key in section}
    for key, measured in sets.items():
        if key == "end_set" and measured is sets.get("early_steps_set"):
            continue
        early, fit = measured["early_steps"], measured["fit"]
        lines += [
            f"  {measured['spec']} ({names[key]}; attempts' controls "
            f"{', '.join(f'{pct:+.2f}' for pct in measured['attempts'])} %)",
            f"    early steps ({window}): bare {early['bare_ms']:.3f} ms, ours {early['ours_ms']:.3f} ms: "
            f"{early['overhead_pct']:+.2f} % (bare vs bare {early['control_pct']:+.2f} %"
            + (
                f"; bare beside MLflow's import {early['import_beside_pct']:+.2f} %)"
                if "import_beside_pct" in early
                else ")"
            ),
            f"    fit(): bare {fit['bare_s']:.2f} s, ours {fit['ours_s']:.2f} s: {fit['extra_s']:+.2f} s "
            f"(bare vs bare {fit['control_s']:+.2f} s)",
            "    the profiled fits' end (median s): "
            + ", ".join(f"{step} {s:.2f}" for step, s in measured["end_breakdown_s"].items() if s >= 0.005),
        ]
        kept = measured.get("kept_sender")
        if kept:
            lines += [
                f"    a later run of the process (kept sender): early steps {kept['early_ms']:.3f} ms: "
                f"{kept['early_overhead_pct']:+.2f} %; fit() {kept['fit_s']:.2f} s: {kept['fit_extra_s']:+.2f} s",
                "      its end (median s): "
                + ", ".join(f"{step} {s:.2f}" for step, s in kept["end_breakdown_s"].items() if s >= 0.005),
            ]
        first = measured.get("callbacks_first")
        if first:
            lines += [
                f"    a first run whose callbacks came {first['setup_s']:.0f} s before the Trainer: early steps "
                f"{first['early_ms']:.3f} ms: {first['early_overhead_pct']:+.2f} %; fit() {first['fit_s']:.2f} s: "
                f"{first['fit_extra_s']:+.2f} s",
                "      its end (median s): "
                + ", ".join(f"{step} {s:.2f}" for step, s in first["end_breakdown_s"].items() if s >= 0.005),
            ]
        beside = {kind: s for kind, s in measured.get("children_cpu_in_window_s", {}).items() if s is not None}
        if beside:
            lines.append(
                f"    CPU of child processes over {window} (median s): "
                + ", ".join(f"{kind} {s:.2f}" for kind, s in beside.items())
            )
    script, delivered = section["script"], section["delivered"]
    lines += [
        f"  a script that fits and exits ({script['spec']}): bare {script['bare_s']:.2f} s, ours "
        f"{script['ours_s']:.2f} s: {script['extra_s']:+.2f} s (bare vs bare {script['control_s']:+.2f} s); its fit() "
        f"{script['fit_extra_s']:+.2f} s",
        "    the same, the MLflow client started first thing (prestart_tracking): "
        f"{script['prestarted_extra_s']:+.2f} s; its fit() {script['prestarted_fit_extra_s']:+.2f} s",
        *_fresh_script_lines(section.get("fresh_script_early")),
        f"  MLflow after the last profiled fit: {delivered['status']}, "
        f"{delivered['metrics'] - len(delivered['absent'])}/{delivered['metrics']} metrics; "
        f"spools left behind: {section['end_set']['spool_left']}",
    ]
    every = section.get("every_core")
    if every:
        longest = every["longest_step_ms"]
        lines += [
            f"  a first run using every core ({every['threads']} torch threads, {every['spec']}, "
            f"{every['repetitions']} repetitions): early steps {every['early_overhead_pct']:+.2f} % "
            f"(bare vs bare {every['early_control_pct']:+.2f} %), fit() {every['fit_extra_s']:+.2f} s "
            f"(bare vs bare {every['fit_control_s']:+.2f} s); longest step bare {longest['bare']:.0f} ms, "
            f"ours {longest['ours']:.0f} ms",
        ]
    return lines


def note_lines(title: str, section: dict[str, Any] | None) -> list[str]:
    return ["", f"{title}: {(section or {}).get('note', 'not run')}"]


def fmt_load(load: Any) -> str:
    return "/".join(f"{value:.1f}" for value in load) if load else "n/a"


if __name__ == "__main__":
    sys.exit(main())
