"""The harness's measurements of the training steps: overhead against bare, throughput accuracy, the MLflow sink's
cost, the always-on cost per step. Each returns a JSON-ready dict (with a `note` when it was cut short)."""

from __future__ import annotations

import dataclasses
import statistics
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


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()
