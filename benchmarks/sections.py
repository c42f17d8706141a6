"""The measurements of the harness; each returns a JSON-ready dict (with a `note` when it was cut short)."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from configurations import (
    CONFIGURATIONS,
    OUR_CONFIGURATIONS,
    OURS_AVAILABLE,
    SINK_AVAILABLE,
    Bench,
    FitResult,
    fit_once,
    lightning_pytorch_profiler,
    missing,
    ours,
)
from measure import HookLoop, spread
from slow_proxy import DelayingProxy, MlflowServer

# ---------------------------------------------------------------- step-time overhead and throughput accuracy

ALWAYS_ON = "ours: always-on"
DETAILED = "ours: detailed preset"
SIMPLE = "ours: simple preset"
ARMED = "ours: simple preset, triggers armed"


def overhead(
    bench: Bench, repetitions: int, warm_up: Sequence[str], only: Sequence[str] | None = None
) -> tuple[dict[str, Any], list[FitResult]]:
    """Step time of every configuration (or of `only` ones, and `bare`) as a ratio to `bare` of the same
    repetition, configurations interleaved.

    Each repetition runs every configuration once, in an order rotated by one per repetition, so that slow
    drifts of the machine's load hit every configuration alike. `warm_up` configurations run once, untimed,
    before the first repetition (process warmup: imports, CUDA context, the sqlite schema).
    """
    unknown = sorted(set(only or ()) - set(CONFIGURATIONS))
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {list(CONFIGURATIONS)}")
    names = [
        name
        for name in CONFIGURATIONS
        if (OURS_AVAILABLE or name not in OUR_CONFIGURATIONS) and (only is None or name in only or name == "bare")
    ]
    absent = missing("anemoi_profiler", "omegaconf", "torchinfo")
    notes = [] if OURS_AVAILABLE else [f"our configurations skipped: cannot import {', '.join(absent)}"]
    if OURS_AVAILABLE and not SINK_AVAILABLE:
        notes.append("MLflow is not installed: our configurations ran with tracking.enabled=false")
    root = bench.work_dir / "overhead"
    for name in warm_up:
        if name in names:
            fit_once(bench, name, root / "warm_up" / _slug(name))
    fits: dict[str, list[FitResult]] = defaultdict(list)
    for repetition in range(repetitions):
        shift = repetition % len(names)
        for name in names[shift:] + names[:shift]:
            fits[name].append(fit_once(bench, name, root / f"rep{repetition}" / _slug(name)))
    bare = [fit.step_ms for fit in fits["bare"]]
    table = {}
    for name in names:
        steps = [fit.step_ms for fit in fits[name]]
        ratios = [step / reference for step, reference in zip(steps, bare, strict=True)]
        table[name] = {
            "step_ms": spread(steps),
            "ratio_to_bare": spread(ratios),
            "per_repetition_ms": steps,
            "best_step_ms": spread([fit.extras["best_step_ms"] for fit in fits[name]]),
            "child_process_cpu_s": statistics.median(fit.extras["child_process_cpu_s"] for fit in fits[name]),
        }
    result = {
        "repetitions": repetitions,
        "warmup_batches": bench.warmup,
        "measured_batches": bench.measured,
        "configurations": table,
        "notes": notes,
    }
    if DETAILED in fits and ALWAYS_ON in fits and "bare (control)" in fits:
        result["outside_windows"] = _outside_windows(bench, fits)
    if ARMED in fits and SIMPLE in fits and "bare (control)" in fits:
        result["triggers_armed"] = _triggers_armed(fits)
    return result, [fit for name in names for fit in fits[name]]


def _triggers_armed(fits: dict[str, list[FitResult]]) -> dict[str, Any]:
    """The simple preset with triggers armed (none fires) against the simple preset, per repetition.

    Per fit, the median and the 10th percentile of its batch times, in wall time and in the training thread's
    CPU time (what the armed hooks add, without the preemption of a busy machine; the low percentile leaves out
    batches that other processes slowed too); per repetition their ratio. The control is the same ratio of the
    bare control to bare: the armed cost is resolved where it stands out of the control's spread.
    """
    times: dict[str, Callable[[FitResult], list[float]]] = {
        "wall": lambda fit: fit.step_times_ms,
        "cpu": lambda fit: fit.extras["step_cpu_times_ms"],
    }
    statistics_ms: dict[str, Callable[[list[float]], float]] = {
        "median": statistics.median,
        "p10": lambda values: statistics.quantiles(values, n=10)[0],
    }
    result: dict[str, Any] = {}
    for clock, batch_ms in times.items():
        for name, statistic in statistics_ms.items():
            per_fit = {config: [statistic(batch_ms(fit)) for fit in fits[config]] for config in fits}
            result[f"{clock}_{name}"] = {
                "ratio_to_simple": _ratios(per_fit[ARMED], per_fit[SIMPLE]),
                "control_ratio": _ratios(per_fit["bare (control)"], per_fit["bare"]),
                "simple_step_ms": statistics.median(per_fit[SIMPLE]),
            }
    return result


def _ratios(values: list[float], references: list[float]) -> dict[str, float]:
    """The spread of each repetition's ratio."""
    return spread([value / reference for value, reference in zip(values, references, strict=True)])


def _outside_windows(bench: Bench, fits: dict[str, list[FitResult]]) -> dict[str, Any]:
    """The detailed preset's batches outside its profiling window against the always-on set's, per repetition.

    Median batch times (robust to stray slow batches), as a ratio; the noise is how far the same ratio of
    the bare control to bare strayed from 1 in the same repetitions.
    """
    window = bench.window

    def median_outside(fit: FitResult) -> float:
        steps = fit.step_times_ms  # steps[i] is batch bench.warmup + i (0-based)
        first, last = window.first_batch, window.last_batch + 1
        return statistics.median(ms for i, ms in enumerate(steps) if not first <= bench.warmup + i <= last)

    def ratios(name: str, reference: str) -> list[float]:
        pairs = zip(fits[name], fits[reference], strict=True)
        return [median_outside(fit) / median_outside(other) for fit, other in pairs]

    control = ratios("bare (control)", "bare")
    return {
        "ratio_to_always_on": spread(ratios(DETAILED, ALWAYS_ON)),
        "noise": max(abs(ratio - 1) for ratio in control),
    }


OUR_THREADS = ("anemoi-profiler-tracking", "SystemMetricsSampler")


def _our_threads_cpu_us(fit: FitResult) -> float:
    return sum(fit.extras["thread_cpu_us_per_batch"].get(name, 0.0) for name in OUR_THREADS)


def always_on_cost(results: dict[str, Any]) -> dict[str, Any]:
    """The always-on set's cost per step as a share of a bare step, from parts that a drifting machine speed
    cannot inflate: each part is a ratio of two times taken a moment apart.

    Training thread: the tight-loop probes of the sink section (sqlite store), each over the bare step
    timed just before it (`measure.HookLoop`). Background: CPU time of our threads per measured batch over
    the step time, in the sink section's long sqlite fit (sends every 0.25 s, samples every 0.5 s: 20
    times as often as shipped, so an upper bound for both sets), counted as if all of it stalled the
    training thread (an upper bound too: it runs on another core and holds the interpreter lock part of
    the time). The MLflow
    sender is a child process: its CPU is reported, not counted (it runs on another core and takes no lock
    the training needs). `shipped`: the `simple` preset as shipped (log every 50 batches, system samples
    every 10 s, sends every 5 s); `busy`: logging every 10 batches, sampling and sending every second.
    """
    try:
        sqlite = results["sink_cost"]["sqlite"]
        table = results["overhead"]["configurations"]
        loops = {"shipped": sqlite["hook_loop_shipped"], "busy": sqlite["hook_loop"]}
        rows = {"shipped": table["ours: simple preset"], "busy": table[ALWAYS_ON]}
        background_pct = sqlite["our_threads_cpu_share_pct"]
    except (KeyError, TypeError):
        return {"note": "needs the overhead and sink sections with our configurations"}
    cost: dict[str, Any] = {}
    for name, loop in loops.items():
        if not loop.get("blocks"):
            return {"note": f"the {name} hook loop measured nothing"}
        thread_pct = loop["share_of_bare_step_pct"]
        cost[name] = {
            "training_thread_us": loop["median_us"],
            "training_thread_pct": thread_pct,
            "background_threads_pct": background_pct,
            "bare_step_us": loop["bare_step_us"],
            "overhead_pct": thread_pct + background_pct,
            "sender_process_cpu_s_per_fit": rows[name]["child_process_cpu_s"],
        }
    return cost


LONG_RUN = "sink: always-on, long"


def throughput_accuracy(fits: list[FitResult]) -> dict[str, Any]:
    """Our `summary/train/samples_per_sec` (report.json) against samples counted over the clock's wall time.

    The two spans differ by where in the last and first measured batch each clock is read (a batch's hook
    work), which weighs in short runs; the long runs of the sink section show the accuracy a real run gets.
    """
    rows = []
    for fit in fits:
        reported = fit.reported_samples_per_sec()
        if reported is None:
            continue
        independent = fit.independent_samples_per_sec
        rows.append(
            {
                "configuration": fit.name,
                "measured_batches": fit.measured_batches,
                "reported": reported,
                "independent": independent,
                "error_pct": (reported / independent - 1) * 100,
            }
        )
    if not rows:
        return {"runs": [], "note": "no run of ours wrote summary/train/samples_per_sec to report.json"}
    long_runs = [abs(row["error_pct"]) for row in rows if row["configuration"] == LONG_RUN]
    errors = [abs(row["error_pct"]) for row in rows]
    return {
        "runs": rows,
        "median_abs_error_pct": statistics.median(errors),
        "long_runs_max_abs_error_pct": max(long_runs) if long_runs else None,
    }


# ---------------------------------------------------------------- MLflow sink cost on the training thread

SINK_LOG_EVERY = 10
LOOP_BETWEEN = 10  # real bare batches timed before each tight-loop probe
SINK_BUSY = [f"log_every_n_steps={SINK_LOG_EVERY}", "system.interval_s=0.5", "tracking.flush_interval_s=0.25"]
PROBE_METRIC = "throughput/train/device/batches_per_sec"


def sink_cost(
    bench: Bench, delay_s: float, server: MlflowServer, loop_blocks: int, cprofile_hooks: bool = False
) -> tuple[dict[str, Any], list[FitResult]]:
    """Per-step time in our hooks (always-on set, logging every 10 batches) with sqlite and with a slow server.

    Per store: one fit timing every hook call (`HookTimer`), one short fit timing blocks of hook calls in a
    tight loop (`HookLoop`). `server` may have been launched early; it is stopped here.
    """
    if not SINK_AVAILABLE:
        server.stop()
        return {
            "note": f"skipped: needs {', '.join(missing('anemoi_profiler', 'mlflow', 'sqlalchemy', 'alembic'))}"
        }, []
    root = bench.work_dir / "sink"
    if not (bench.work_dir / "mlflow.db").exists():
        # Untimed first fit: the sqlite schema and MLflow's imports are a one-off cost of the process.
        fit_once(bench, "sink warm-up", root / "warm_up", setup=ours(bench, "simple", SINK_BUSY))
    result: dict[str, Any] = {"log_every_n_steps": SINK_LOG_EVERY, "flush_interval_s": 0.25, "delay_s": delay_s}
    fits = []
    result["sqlite"], fit = _timed_sink_fit(bench, root / "sqlite", None, cprofile_hooks)
    fits.append(fit)
    result["sqlite"]["hook_loop"] = _hook_loop(bench, root / "sqlite_loop", None, loop_blocks, SINK_BUSY)
    # The always-on set as shipped (`simple` preset: log every 50 batches, system samples every 10 s).
    result["sqlite"]["hook_loop_shipped"] = _hook_loop(bench, root / "shipped_loop", None, loop_blocks, [])
    try:
        try:
            started_in = server.wait_ready()
        except (RuntimeError, TimeoutError) as error:
            result["slow_server"] = {"note": f"skipped: mlflow server did not start: {str(error)[:300]}"}
            return result, fits
        proxy = DelayingProxy(server.port, delay_s).start()
        try:
            slow, fit = _timed_sink_fit(bench, root / "slow_server", proxy.uri, cprofile_hooks, server.uri)
            fits.append(fit)
            slow["hook_loop"] = _hook_loop(bench, root / "slow_server_loop", proxy.uri, loop_blocks, SINK_BUSY)
            slow["server_ready_after_s"] = started_in
            slow["proxied_requests"] = proxy.requests
            result["slow_server"] = slow
        finally:
            proxy.stop()
    finally:
        server.stop()
    return result, fits


def _timed_sink_fit(
    bench: Bench, folder: Path, tracking_uri: str | None, cprofile_hooks: bool, read_back_uri: str | None = None
) -> tuple[dict[str, Any], FitResult]:
    setup = ours(bench, "simple", SINK_BUSY, tracking_uri=tracking_uri)
    fit = fit_once(bench, LONG_RUN, folder, setup=setup, time_hooks=True, cprofile_hooks=cprofile_hooks)
    sink = setup.ours[0].session.sink
    delivered = _metric_points(read_back_uri or bench.tracking_uri, sink.run_id if sink else None, PROBE_METRIC)
    spooled = sorted(p.name for p in (fit.run_dir / "spool").rglob("batch-*.json")) if fit.run_dir else []
    result = {
        "hooks": fit.hooks,
        "step_ms": fit.step_ms,
        "end_of_fit_s": fit.extras["end_of_fit_s"],
        "probe_metric": PROBE_METRIC,
        "probe_points_delivered": delivered,
        "probe_points_expected": bench.measured // SINK_LOG_EVERY,
        "left_in_spool": len(spooled),
        "our_threads_cpu_share_pct": _our_threads_cpu_us(fit) / (fit.step_ms * 1000) * 100,
    }
    if cprofile_hooks:
        result["cprofile"] = fit.extras.get("cprofile", "")
    return result, fit


def _hook_loop(bench: Bench, folder: Path, tracking_uri: str | None, blocks: int, extra: list[str]) -> dict[str, Any]:
    setup = ours(bench, "simple", [*extra, "tracking.upload_artifacts=false"], tracking_uri=tracking_uri)
    loop = HookLoop(setup.ours, after_batch=bench.warmup + 1, blocks=blocks, per_block=100, between=LOOP_BETWEEN)
    setup.callbacks.append(loop)
    sized = dataclasses.replace(bench, measured=loop.total - bench.warmup + 1)
    fit_once(sized, "sink: hook loop", folder, setup=setup)
    return loop.summary()


def _metric_points(tracking_uri: str, run_id: str | None, key: str) -> int | None:
    if run_id is None:
        return None
    from mlflow.tracking import MlflowClient

    try:
        return len(MlflowClient(tracking_uri).get_metric_history(run_id, key))
    except Exception:
        return None


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


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


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
