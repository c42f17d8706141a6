"""The harness's targets: each figure's threshold, where it sits in results.json, and the control that says when
the machine could not resolve it (NOISY). See docs/benchmarks.md, Targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
        "short_run_fit_extra_s",
        "short CPU fit of 160 steps: fit() wall time, default callbacks minus bare (median, s)",
        "<=",
        2.0,
        lambda r: r["short_run"]["fit"]["extra_s"],
    ),
    Target(
        "short_run_script_extra_s",
        "short CPU fit of 160 steps: a script that fits and exits, default callbacks minus bare (median, s)",
        "<=",
        3.0,
        lambda r: r["short_run"]["script"]["extra_s"],
    ),
    Target(
        "window_end_ratio",
        "a large window's end on the training thread: ours over torch.profiler alone with one export (medians)",
        "<=",
        1.10,
        lambda r: r["window_end"]["end_ratio"],
    ),
    Target(
        "window_after_step_over_bound",
        "longest step after the window over its bound max(100 ms, 5x steady step), worst fit of ours",
        "<=",
        1.0,
        lambda r: r["window_end"]["ours_after_over_bound_max"],
    ),
    Target(
        "outside_windows_excess_pp",
        "detailed preset outside its windows vs always-on: |median ratio - 1| beyond the control's (pp)",
        "<=",
        0.0,
        outside_windows_excess,
    ),
]


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
