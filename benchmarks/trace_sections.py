"""The harness's measurements of profiling windows and what follows them: trace export and size, the end-of-run
reports, HTA time against ranks, the detailed preset end to end. Each returns a JSON-ready dict (with a `note`
when it was cut short)."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from configurations import (
    OURS_AVAILABLE,
    Bench,
    FitResult,
    fit_once,
    lightning_pytorch_profiler,
    missing,
    ours,
)

# ---------------------------------------------------------------- trace export and end-of-run reports

PROFILER_ONLY = [
    "throughput.enabled=false",
    "timing.enabled=false",
    "system.enabled=false",
    "memory_snapshot.enabled=false",
    "model_summary.enabled=false",
    "tracking.enabled=false",
    "profiler.with_flops=false",
    "profiler.with_modules=false",
    "profiler.memory_timeline=false",
    "profiler.record_shapes=true",
    "profiler.profile_memory=true",
]


def trace_and_report_cost(bench: Bench) -> dict[str, Any]:
    """One profiling window (record_shapes, profile_memory) written by ours and by Lightning's PyTorchProfiler.

    Training-thread cost: the window's steps over the median step. Files: our gzipped trace against
    Lightning's plain JSON. Reports: building our end-of-run reports from that window.
    """
    if not OURS_AVAILABLE:
        return {"note": "skipped: anemoi_profiler cannot be imported"}
    from anemoi_profiler.callbacks import torch_profiler as torch_profiler_module
    from anemoi_profiler.profiling.traces import json_size, rank_info, write_ranked_trace

    root = bench.work_dir / "traces"
    window = bench.window
    setup = ours(bench, "detailed", PROFILER_ONLY)
    timings: dict[str, float] = {}
    session = setup.ours[0].session
    session._write_report = _timing(timings, "write_report_s", session._write_report)
    original = torch_profiler_module.summarize_windows
    torch_profiler_module.summarize_windows = _timing(timings, "build_reports_s", original)
    try:
        our_fit = fit_once(bench, "ours: profiler only", root / "ours", setup=setup)
    finally:
        torch_profiler_module.summarize_windows = original
    lightning_setup = lightning_pytorch_profiler(bench, root / "lightning")
    lightning_fit = fit_once(bench, "Lightning PyTorchProfiler", root / "lightning", setup=lightning_setup)
    our_traces = sorted((our_fit.run_dir or root).rglob("*.pt.trace.json.gz"))
    lightning_traces = sorted((root / "lightning").rglob("*.pt.trace.json"))
    result: dict[str, Any] = {
        "window": {"first_batch": window.first_batch, "last_batch": window.last_batch, "active": window.active},
        "ours": _window_cost(our_fit, bench),
        "lightning": _window_cost(lightning_fit, bench),
    }
    if our_traces:
        trace = our_traces[0]
        result["ours"].update(trace_gz_bytes=trace.stat().st_size, trace_json_bytes=json_size(trace), path=str(trace))
    if lightning_traces:
        plain = lightning_traces[0]
        result["lightning"]["trace_json_bytes"] = plain.stat().st_size
        # Our background work on the same content: add the rank, gzip (level 6).
        target = root / "lightning_trace_regzipped.pt.trace.json.gz"
        started = time.perf_counter()
        write_ranked_trace(plain, target, rank_info(0, 1))
        result["gzip_of_lightning_trace_s"] = time.perf_counter() - started
    if our_traces and lightning_traces:
        result["size_ratio_lightning_json_to_ours_gz"] = (
            result["lightning"]["trace_json_bytes"] / result["ours"]["trace_gz_bytes"]
        )
    else:
        result["note"] = f"trace missing: ours {len(our_traces)}, Lightning {len(lightning_traces)}"
    result["reports"] = {
        "build_reports_s": timings.get("build_reports_s"),
        "write_report_s": timings.get("write_report_s"),
        "files": sorted(p.name for p in (our_fit.run_dir or root).glob("*_report.*")),
        "what": "summarize_windows (time_report.*, memory_report.*, report sections) and report.txt/json",
    }
    return result


def _window_cost(fit: FitResult, bench: Bench) -> dict[str, Any]:
    """How much longer the window's batches took than the median of the other measured batches."""
    window = bench.window
    steps = fit.step_times_ms  # steps[i] is batch bench.warmup + i (0-based)
    inside = [i for i in range(len(steps)) if window.first_batch <= bench.warmup + i <= window.last_batch + 1]
    outside = [steps[i] for i in range(len(steps)) if i not in inside]
    baseline = statistics.median(outside) if outside else 0.0
    return {
        "median_step_ms": baseline,
        "window_extra_ms": sum(steps[i] - baseline for i in inside),
        "slowest_window_step_ms": max((steps[i] for i in inside), default=0.0),
        "end_of_fit_s": fit.extras["end_of_fit_s"],
    }


def _timing(timings: dict[str, float], key: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - started

    return timed


# ---------------------------------------------------------------- HTA analysis time against ranks


def hta_scaling(fixture: Path, ranks: Sequence[int], time_limit_s: float, work_dir: Path) -> dict[str, Any]:
    """`analyze` (as `anemoi-profiler analyze` runs it) over N copies of one H200 trace, each with its own
    `distributedInfo.rank`: wall time and the HTA process's peak resident memory; and for the largest N the
    first 8 ranks alone (`--ranks 0-7`)."""
    absent = missing("hta", "anemoi_profiler")
    if absent:
        return {"note": f"skipped: cannot import {', '.join(absent)} (pip install 'anemoi-profiler[hta]')"}
    if not fixture.is_file():
        return {"note": f"skipped: fixture {fixture} not found"}
    from anemoi_profiler.analysis import analyze

    trace = _trace_without_rank(fixture)
    opening = trace.index(b"{") + 1
    rows = []
    runs: list[tuple[int, list[int] | None]] = [(count, None) for count in ranks]
    if max(ranks) > 8:
        runs.append((max(ranks), list(range(8))))
    for count, subset in runs:
        folder = work_dir / "hta" / f"ranks_{count}"
        if subset is None:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for rank in range(count):
                info = json.dumps({"rank": rank, "world_size": count, "backend": "nccl"}).encode()
                with gzip.open(folder / f"rank{rank}.pt.trace.json.gz", "wb", compresslevel=1) as out:
                    out.write(trace[:opening] + b'"distributedInfo": ' + info + b"," + trace[opening:])
        started = time.perf_counter()
        summary = analyze(folder, work_dir / "hta" / f"out_{count}_{len(subset or [])}", time_limit_s, ranks=subset)
        (window,) = summary["windows"]
        rows.append(
            {
                "ranks": count,
                "analysed": len(window["ranks"]),
                "seconds": time.perf_counter() - started,
                "load_traces_s": window["analysis_seconds"].get("load_traces"),
                "peak_rss_mb": window.get("peak_rss_mb"),
                "ran": window["ran"],
                "skipped": sorted(window["skipped"]),
                "failed": window["failed"],
            }
        )
    return {"fixture": str(fixture), "time_limit_s": time_limit_s, "runs": rows}


def _trace_without_rank(path: Path) -> bytes:
    """The trace's JSON text without `distributedInfo`, so that each copy can get its own in front."""
    with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as file:
        text = file.read()
    if b'"distributedInfo"' not in text[: 1 << 16]:  # torch writes its metadata before the events
        return text
    document = json.loads(text)
    document.pop("distributedInfo", None)
    return json.dumps(document).encode()


# ---------------------------------------------------------------- the detailed preset end to end

DETAILED_FILES = {
    "time_report": "time_report.json",
    "memory_report": "memory_report.json",
    "model_summary": "model_summary.txt",
    "report": "report.json",
    "trace": "traces/train/window_0/rank0.pt.trace.json.gz",
    "memory_snapshot": "memory/snapshot_rank0.pickle",
    "memory_timeline": "memory/timeline_rank0.html",
}
CUDA_ONLY = ("memory_snapshot", "memory_timeline")


def detailed_preset_check(bench: Bench, hta_time_limit_s: float) -> dict[str, Any]:
    """One fit with the detailed preset: which artifacts it wrote, the CUDA memory figures, the NVML metrics
    it logged, and HTA over the traces it wrote. On CPU the CUDA-only parts are reported as skipped."""
    if not OURS_AVAILABLE:
        return {"note": "skipped: anemoi_profiler cannot be imported"}
    cuda = bench.device == "cuda"
    setup = ours(bench, "detailed", ["system.interval_s=1"])
    fit = fit_once(bench, "ours: detailed preset", bench.work_dir / "detailed", setup=setup)
    run_dir = fit.run_dir
    assert run_dir is not None
    files: dict[str, Any] = {}
    for key, relative in DETAILED_FILES.items():
        path = run_dir / relative
        if path.is_file():
            files[key] = {"path": relative, "bytes": path.stat().st_size}
        else:
            files[key] = "skipped: CUDA only" if key in CUDA_ONLY and not cuda else "MISSING"
    result: dict[str, Any] = {"run_dir": str(run_dir), "step_ms": fit.step_ms, "files": files}
    report = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").is_file() else {}
    result["step_time_and_memory"] = report.get("sections", {}).get("Step time and memory", {}).get("data")
    memory_report = run_dir / "memory_report.json"
    if memory_report.is_file():
        document = json.loads(memory_report.read_text())
        result["memory_report"] = {
            "device_columns": any(window.get("device") for window in document.get("windows", [])),
            "profiled_steps": (document.get("profiled_steps") or {}).get("totals"),
        }
    sink = setup.ours[0].session.sink
    result["system_metrics"] = _logged_system_metrics(bench.tracking_uri, sink.run_id if sink else None, cuda)
    result["hta"] = _hta_on_run(run_dir, hta_time_limit_s)
    return result


def _logged_system_metrics(tracking_uri: str, run_id: str | None, cuda: bool) -> dict[str, Any]:
    if run_id is None:
        return {"note": "skipped: no MLflow run (tracking off)"}
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(tracking_uri).get_run(run_id).data.metrics
    keys = sorted(k for k in metrics if k.startswith("system/"))
    gpu_keys = [key for key in keys if key.startswith("system/gpu_")]
    energy = {key: value for key, value in metrics.items() if key.startswith("summary/energy/")}
    result: dict[str, Any] = {"keys": len(keys), "gpu_keys": gpu_keys, "energy": energy}
    if not cuda:
        result["nvml"] = "skipped: no CUDA device"
    elif missing("pynvml"):
        result["nvml"] = "skipped: nvidia-ml-py is not installed"
    else:
        result["nvml"] = "ok" if gpu_keys else "MISSING: no system/gpu_* metric was logged"
    return result


def _hta_on_run(run_dir: Path, time_limit_s: float) -> dict[str, Any]:
    """The preset's own HTA results (hta/summary.json, written after the fit) or, without them, a run of ours."""
    own = run_dir / "hta" / "summary.json"
    if own.is_file():
        summary, source, seconds = json.loads(own.read_text()), "the preset's HtaCallback", None
    elif missing("hta"):
        return {"note": "skipped: HTA is not installed (pip install 'anemoi-profiler[hta]')"}
    else:
        from anemoi_profiler.analysis import analyze

        started = time.perf_counter()
        summary = analyze(run_dir / "traces", run_dir / "hta_benchmark", time_limit_s)
        source, seconds = "analyze() run by the benchmark", time.perf_counter() - started
    windows = [
        {"window": w.get("window"), "ran": w["ran"], "skipped": w["skipped"], "failed": w.get("failed", {})}
        for w in summary.get("windows", [summary])
    ]
    return {"source": source, "seconds": seconds, "windows": windows}
