"""Why B is slower: the module diff of the runs' profiler windows, or what to rerun to get one. Torch-free."""

from __future__ import annotations

import numpy as np

from anemoi_profiler.reports.module_diff import TOP_MODULES, diff, module_times
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.run_files.steps_file import read_steps

HOW_TO_GET_WINDOWS = (
    "rerun both with profiler windows that record modules: the `detailed` preset with profiler.with_stack=true "
    "(or profiler.enabled=true profiler.with_stack=true)"
)


def why_lines(a: RunData, b: RunData) -> list[str]:
    """Lines for the CI log: per module the change per profiled step, its share, the operators behind it."""
    times_a, times_b = module_times(a.folder), module_times(b.folder)
    if times_a is None or times_b is None:
        has_windows = a.operator_windows("train") and b.operator_windows("train")
        if has_windows:
            return [
                "why: the traces hold no module names (or were not kept: an MLflow download has none); the "
                f"operator table below shows what changed; for a module diff, {HOW_TO_GET_WINDOWS}"
            ]
        return [f"why: not assessed: the runs have no training profiler windows; {HOW_TO_GET_WINDOWS}"]
    median_change = _median_step_ms(b) - _median_step_ms(a) if _median_step_ms(a) and _median_step_ms(b) else 0.0
    roots = [path for path in sorted(set(times_a.inclusive_ms) | set(times_b.inclusive_ms)) if "/" not in path]
    forward_change = sum(times_b.inclusive_ms.get(p, 0.0) - times_a.inclusive_ms.get(p, 0.0) for p in roots)
    profiled_change = times_b.step_ms - times_a.step_ms if times_a.step_ms and times_b.step_ms else forward_change
    changes = diff(times_a, times_b, profiled_change)[:TOP_MODULES]
    lines = [
        f"why: by module (forward, host ms per profiled step, B - A): the profiled step changed "
        f"{profiled_change:+.2f} ms, the modules' forward {forward_change:+.2f} ms (the median steady step "
        f"{median_change:+.2f} ms)"
    ]
    for change in changes:
        operators = ", ".join(f"{name} {delta:+.2f}" for name, delta in change.operators)
        label = f"{change.path} ({change.note})" if change.note else change.path
        lines.append(
            f"  {label}: self {change.self_delta_ms:+.2f} ms ({change.share:+.0%} of the profiled step's "
            f"change), with submodules {change.inclusive_delta_ms:+.2f} ms"
            + (f"; operators: {operators}" if operators else "")
        )
    explained = sum(change.self_delta_ms for change in changes if change.self_delta_ms > 0)
    if profiled_change > 0:
        lines.append(f"  the top {len(changes)} modules explain {explained / profiled_change:.0%} of it")
    return lines


def _median_step_ms(run: RunData) -> float:
    series = read_steps(run.folder).get("train")
    steady = series.steady() if series is not None else np.array([])
    return 1000 * float(np.median(steady)) if len(steady) else 0.0
