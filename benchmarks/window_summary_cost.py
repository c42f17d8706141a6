"""What the window summary costs on a large window, beside HTA on the same trace, in one run.

    python benchmarks/window_summary_cost.py [--events 2700000] [--out results.json] [--skip-hta]

A synthetic window of `--events` events (default 2.7 million, the size of a quarter of real traces per HTA
PR #110): CPU ops (40 %), kernel launches (30 %), and device work (30 %: kernels on four compute streams,
memcpy/memset, NCCL kernels on a stream of their own), 20 `ProfilerStep`s. Each measurement runs in a fresh
child process, which reports its wall time and its peak RSS above what it held before the measured part
(`/proc/self/clear_refs` resets the peak):

- `sweep`: `summarize()` over the columns, as the profiler runs it once it has the events (median of 3 runs);
- `kineto`: reading a real torch.profiler window's events into columns (`window_events_from_kineto`),
  per event, scaled to `--events` (torch cannot make a 2.7-million-event window on a CPU in reasonable time),
  and beside it torch's own list of event objects (`events()`), which every reader pays before reading a field;
- `summarize`: the `summarize` command's work on the saved trace (gzipped Chrome JSON);
- `helper_plain`, `helper_gz`: the window helper's work (`summarize(read_window_events(path))`, median of 3) on
  the plain JSON torch exports (what the helper reads when traces are off) and on the gzipped trace (what it
  reads when the run keeps traces: it waits for the background gzip);
- `hta`: HTA's TraceAnalysis on the same file, then its temporal, idle-time, overlap and kernel breakdowns.

Each child reports its wall `seconds` and its CPU time (`cpu_seconds`, user + system of the process).

Targets: the in-process summary (kineto + sweep) <= 1 s and <= 50 MB; the helper's summary of 2.7 million
events <= 3 s of CPU (`helper_plain`, `helper_gz`; issue 51). See docs/hta.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

STEPS = 20
COMPUTE_STREAMS = (7, 20, 21, 22)
NCCL_STREAM = 30
KERNEL_NAMES = 2000
NCCL_NAMES = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL",
              "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL")  # fmt: skip
TARGET_SECONDS, TARGET_MB = 1.0, 50.0
SWEEP_RUNS = 3
"""The sweep and the helper's read are short enough to repeat: the median run is reported (a shared machine's
timings drift)."""
REPEATED = ("sweep", "helper_plain", "helper_gz")
MODES = ("sweep", "kineto", "summarize", "helper_plain", "helper_gz", "hta")
HELPER_TARGET_CPU_S = 3.0


def synthetic_columns(events: int, seed: int = 0) -> dict[str, np.ndarray | list[str]]:
    """The window as columns: kind (0 host, 1 step, 2 launch, 3 device), name id, start, dur, stream, correlation."""
    from anemoi_profiler.profiling.window_events import DEVICE, HOST, LAUNCH, STEP

    rng = np.random.default_rng(seed)
    device = int(events * 0.30)
    host = events - 2 * device - STEPS
    stream = rng.choice([*COMPUTE_STREAMS, NCCL_STREAM], size=device, p=[0.3, 0.3, 0.18, 0.15, 0.07])
    dur = rng.lognormal(np.log(6.0), 0.8, size=device)
    dur[stream == NCCL_STREAM] *= 20
    start = np.empty(device)
    for s in (*COMPUTE_STREAMS, NCCL_STREAM):  # back to back on each stream, with gaps of a few us
        on = np.flatnonzero(stream == s)
        gaps = rng.exponential(4.0 if s != NCCL_STREAM else 60.0, size=len(on))
        start[on] = np.cumsum(gaps + dur[on]) - dur[on]
    window_us = float((start + dur).max())
    names = [f"void kernel_{i}<float, {i % 7}>(float const*, float*, int)" for i in range(KERNEL_NAMES)]
    names += ["Memcpy DtoD (Device -> Device)", "Memset (Device)", *NCCL_NAMES]
    names += ["cudaLaunchKernel", *(f"aten::op_{i}" for i in range(300)), *(f"ProfilerStep#{i}" for i in range(STEPS))]
    zipf = np.minimum(rng.zipf(1.3, size=device) - 1, KERNEL_NAMES - 1)
    name_id = zipf.copy()
    memory = rng.random(device) < 0.1
    name_id[memory] = KERNEL_NAMES + (rng.random(int(memory.sum())) < 0.5)
    nccl = stream == NCCL_STREAM
    name_id[nccl] = KERNEL_NAMES + 2 + rng.integers(0, len(NCCL_NAMES), int(nccl.sum()))
    correlation = 10_000_000 + np.arange(device)  # CUPTI's ids grow over a process's life (and HTA needs int32)
    launch_dur = rng.lognormal(np.log(4.0), 0.5, size=device)
    launch_start = np.maximum(start - rng.exponential(40.0, size=device) - launch_dur, 0.0)
    op_start = rng.uniform(0, window_us, size=host)
    op_dur = rng.lognormal(np.log(15.0), 1.0, size=host)
    step_len = window_us / STEPS
    first_op = KERNEL_NAMES + 2 + len(NCCL_NAMES) + 1
    return {
        "names": names,
        "kind": np.concatenate(
            [np.full(STEPS, STEP), np.full(host, HOST), np.full(device, LAUNCH), np.full(device, DEVICE)]
        ).astype(np.int8),
        "name_id": np.concatenate(
            [
                first_op + 300 + np.arange(STEPS),
                first_op + rng.integers(0, 300, host),
                np.full(device, first_op - 1),
                name_id,
            ]
        ).astype(np.int32),
        "start_us": np.concatenate([np.arange(STEPS) * step_len, op_start, launch_start, start]),
        "dur_us": np.concatenate([np.full(STEPS, step_len), op_dur, launch_dur, dur]),
        "stream": np.concatenate([np.full(STEPS + host + device, -1), stream]).astype(np.int32),
        "correlation": np.concatenate([np.full(STEPS + host, -1), correlation, correlation]).astype(np.int64),
    }


def write_chrome_trace(columns: dict, path: Path) -> None:
    """The window as torch exports it: kineto's key order and layout (an event over four lines)."""
    categories = {0: "cpu_op", 1: "user_annotation", 2: "cuda_runtime", 3: "kernel"}
    names = [json.dumps(name) for name in columns["names"]]
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write('{\n  "schemaVersion": 1,\n  "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"},\n')
        out.write('  "traceEvents": [\n')
        keys = ("kind", "name_id", "start_us", "dur_us", "stream", "correlation")
        rows = zip(*(columns[key].tolist() for key in keys), strict=True)
        for index, (kind, name_id, start, dur, stream, correlation) in enumerate(rows):
            name = names[name_id]
            category = categories[kind]
            if kind == 3 and name.startswith('"Mem'):
                category = "gpu_memcpy" if name.startswith('"Memcpy') else "gpu_memset"
            if kind == 3:
                pid, tid, args = 0, stream, f'"device": 0, "stream": {stream}, "correlation": {correlation}'
            else:
                pid, tid, args = 1, 1 if kind != 2 else 2, f'"correlation": {correlation}' if kind == 2 else ""
            out.write(",\n" if index else "")
            out.write(
                f'  {{\n    "ph": "X", "cat": "{category}", "name": {name}, "pid": {pid}, '
                f'"tid": {tid},\n    "ts": {start:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}'
            )
        out.write('\n  ],\n  "traceName": "synthetic"\n}\n')


# ---- the measurements, each in a child process ----
def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def child(mode: str, events: int, trace: str) -> dict:
    if mode == "sweep":
        from anemoi_profiler.profiling.window_events import WindowEvents
        from anemoi_profiler.profiling.window_summary import summarize

        columns = synthetic_columns(events)
        window = WindowEvents(**columns)
        work = lambda: summarize(window)  # noqa: E731
    elif mode == "kineto":
        return _kineto_per_event(events)
    elif mode == "summarize":
        from anemoi_profiler.cli.summarize_command import summarize_folder

        def work() -> dict:
            table = summarize_folder(Path(trace).parent)
            return {field: float(table.column(field)[0]) for field in ("idle_pct", "compute_pct", "overlap_pct")}

    elif mode.startswith("helper_"):
        from anemoi_profiler.profiling.trace_stream import read_window_events
        from anemoi_profiler.profiling.window_summary import summarize

        path = Path(trace) if mode == "helper_gz" else Path(trace).with_suffix("")

        def work() -> dict:
            summary = summarize(read_window_events(path))
            return {field: float(summary.values[field]) for field in ("idle_pct", "compute_pct", "overlap_pct")}

    else:
        work = lambda: _hta(Path(trace).parent)  # noqa: E731
    before = _rss_mb("VmRSS")
    _reset_peak()
    started, cpu_started = time.perf_counter(), time.process_time()
    figures = work()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "extra_peak_mb": _rss_mb("VmHWM") - before,
        **(figures if isinstance(figures, dict) else {}),
    }


def _kineto_per_event(events: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from anemoi_profiler.profiling.kineto_events import window_events_from_kineto

    x = torch.ones(4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(STEPS):
            with record_function(f"ProfilerStep#{step}"):
                for _ in range(10_000):
                    x = x.add(1)
    results = prof.profiler.kineto_results
    recorded = len(results.events())
    floor = _measured(results.events)  # torch's list of event objects alone: what any reader pays first
    reader = _measured(lambda: window_events_from_kineto(results))
    scale = events / recorded
    return {
        "recorded_events": recorded,
        "seconds_per_event": reader["seconds"] / recorded,
        "seconds": reader["seconds"] * scale,
        "extra_peak_mb": reader["extra_peak_mb"] * scale,
        "torch_events_list": {"seconds": floor["seconds"] * scale, "extra_peak_mb": floor["extra_peak_mb"] * scale},
    }


def _measured(work: Callable[[], object]) -> dict:
    """Wall time and peak RSS above the start of one call of `work` (its result dropped before returning)."""
    before = _rss_mb("VmRSS")
    _reset_peak()
    started = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - started
    extra_peak_mb = _rss_mb("VmHWM") - before
    del result
    return {"seconds": seconds, "extra_peak_mb": extra_peak_mb}


def _hta(folder: Path) -> dict:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # as the agreement tests: both tools see the same intervals
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    temporal = analysis.get_temporal_breakdown(visualize=False)
    analysis.get_idle_time_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    analysis.get_gpu_kernel_breakdown(visualize=False)
    return {
        "idle_pct": float(temporal["idle_time_pctg"][0]),
        "compute_pct": float(temporal["compute_time_pctg"][0]),
        "overlap_pct": float(overlap["comp_comm_overlap_pctg"][0]),
    }


def measure(mode: str, events: int, trace: Path, timeout_s: float) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--events", str(events), "--trace", str(trace)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:g} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_700_000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    parser.add_argument("--hta-timeout", type=float, default=900)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.events, args.trace)))
        return 0
    results: dict = {"events": args.events, "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="window-summary-bench-") as folder:
        trace = Path(folder) / "rank0.pt.trace.json.gz"
        started = time.perf_counter()
        write_chrome_trace(synthetic_columns(args.events), trace)
        results["trace"] = {"gz_mb": trace.stat().st_size / 1e6, "write_seconds": time.perf_counter() - started}
        modes = [mode for mode in args.modes.split(",") if not (args.skip_hta and mode == "hta")]
        if {"helper_plain"} & set(modes):  # the plain export, as torch writes it before the background gzip
            with gzip.open(trace, "rb") as packed, open(trace.with_suffix(""), "wb") as plain:
                while block := packed.read(1 << 24):
                    plain.write(block)
            results["trace"]["json_mb"] = trace.with_suffix("").stat().st_size / 1e6
        print(f"trace written: {results['trace']}", file=sys.stderr)
        for mode in modes:
            runs = [
                measure(mode, args.events, trace, args.hta_timeout)
                for _ in range(SWEEP_RUNS if mode in REPEATED else 1)
            ]
            results[mode] = sorted(runs, key=lambda run: run.get("seconds", np.inf))[len(runs) // 2]  # the median
            if len(runs) > 1:
                results[mode]["runs"] = [{k: run.get(k) for k in ("seconds", "cpu_seconds")} for run in runs]
                cpu = sorted(run.get("cpu_seconds", np.inf) for run in runs)
                results[mode]["median_cpu_seconds"] = cpu[len(cpu) // 2]
            print(f"{mode}: {results[mode]}", file=sys.stderr)
    if "sweep" in results and "kineto" in results:
        in_process_s = results["sweep"].get("seconds", np.nan) + results["kineto"].get("seconds", np.nan)
        in_process_mb = max(
            results["sweep"].get("extra_peak_mb", np.nan), results["kineto"].get("extra_peak_mb", np.nan)
        )
        meets = bool(in_process_s <= TARGET_SECONDS and in_process_mb <= TARGET_MB)
        results["in_process"] = {"seconds": in_process_s, "extra_peak_mb": in_process_mb, "meets_targets": meets}
    for mode in ("helper_plain", "helper_gz"):
        if "median_cpu_seconds" in results.get(mode, {}):
            results[mode]["meets_target"] = bool(results[mode]["median_cpu_seconds"] <= HELPER_TARGET_CPU_S)
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
