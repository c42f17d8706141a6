"""`compare A B --fail-if-slower 5%`: the verdict a CI job acts on, its evidence, and its exit code.

A side is one or more runs (runs are the better replicates: they also vary what one run holds constant). The
figure tested is the training step by default (`steps.json`, steady steps only), or another one (`METRICS`).
Exit codes: 0 not slower, 1 slower (or more memory), 3 inconclusive, 4 not comparable (2 stays with usage
errors). Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anemoi_profiler import names
from anemoi_profiler.reports.comparability import allowed, differences
from anemoi_profiler.reports.gate import (
    DRIFT_FLOOR_PCT,
    MAX_RUNS_ADVISED,
    MAX_STEPS_ADVISED,
    GateResult,
    judge_slowdown,
)
from anemoi_profiler.reports.html import esc
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.run_files.steps_file import read_steps

NOT_COMPARABLE_EXIT = 4
METRICS: dict[str, tuple[str, str, bool]] = {
    "step": ("training step", "train", False),
    "val_step": ("validation step", "val", False),
    "throughput": ("training samples/s", names.TRAIN_SAMPLES_PER_SEC, True),
    "items": ("training items/s", names.TRAIN_ITEMS_PER_SEC, True),
    "val_throughput": ("validation samples/s", names.VAL_SAMPLES_PER_SEC, True),
}
"""`--metric` names: label, source (a stage of steps.json, else a per-interval key of metrics.json), whether higher
is better (a rate is tested as its reciprocal, time per sample: 'slower' keeps its meaning)."""
MEMORY_FIGURES = (names.PEAK_ALLOCATED_MB, names.PEAK_RESERVED_MB, names.CPU_RSS_MB)
"""Peak memory figures `--fail-if-more-memory` tests, the first both sides recorded (GPU before CPU)."""


@dataclass
class Side:
    """A side's replicates of the tested figure: one array per run, and what was left out of them."""

    runs: list[RunData]
    values: list[np.ndarray] = field(default_factory=list)
    counted: list[int] = field(default_factory=list)
    """Recorded values per run, steady or not."""
    flagged: dict[str, int] = field(default_factory=dict)


@dataclass
class MemoryCheck:
    figure: str
    a_mb: float
    b_mb: float
    threshold_pct: float

    @property
    def pct(self) -> float:
        return 100 * (self.b_mb / self.a_mb - 1) if self.a_mb else 0.0

    @property
    def more(self) -> bool:
        return self.pct > self.threshold_pct


@dataclass
class GateVerdict:
    metric: str
    mismatches: dict[str, tuple[str, str]]
    allowed_mismatches: dict[str, tuple[str, str]]
    result: GateResult | None = None
    sides: tuple[Side, Side] | None = None
    memory: MemoryCheck | None = None

    @property
    def exit_code(self) -> int:
        if self.mismatches:
            return NOT_COMPARABLE_EXIT
        if (self.memory is not None and self.memory.more) or (self.result is not None and self.result.exit_code == 1):
            return 1
        return self.result.exit_code if self.result is not None else 0


class GateInputError(ValueError):
    """The runs cannot be gated on the asked figure (not recorded, an unknown name); the message says which."""


def run_gate(
    a_runs: list[RunData],
    b_runs: list[RunData],
    threshold_pct: float | None,
    metric: str = "step",
    allow_mismatch: list[str] | None = None,
    memory_threshold_pct: float | None = None,
    drift_floor_pct: float = DRIFT_FLOOR_PCT,
) -> GateVerdict:
    """Check that the sides are comparable, then test the slowdown and the memory growth that were asked for."""
    found: dict[str, tuple[str, str]] = {}
    for a in a_runs:
        for b in b_runs:
            found.update(differences(a, b))
    allowances = allow_mismatch or []
    verdict = GateVerdict(
        metric,
        {key: values for key, values in found.items() if not allowed(key, allowances)},
        {key: values for key, values in found.items() if allowed(key, allowances)},
    )
    if verdict.mismatches:
        return verdict
    if threshold_pct is not None:
        sides = (replicates(a_runs, metric), replicates(b_runs, metric))
        verdict.sides = sides
        verdict.result = judge_slowdown(
            sides[0].values, sides[1].values, threshold_pct, drift_floor_pct=drift_floor_pct
        )
    if memory_threshold_pct is not None:
        verdict.memory = memory_check(a_runs, b_runs, memory_threshold_pct)
    return verdict


def replicates(runs: list[RunData], metric: str) -> Side:
    if metric not in METRICS:
        raise GateInputError(f"unknown --metric {metric!r}; choose one of {', '.join(METRICS)}")
    _, source, higher_is_better = METRICS[metric]
    side = Side(runs)
    for run in runs:
        if "/" in source:
            values = np.asarray(run.series(source)[1], dtype=np.float64)
            if not len(values):
                raise GateInputError(f"{run.folder} has no {source} in metrics.json")
            values = 1 / values[values > 0] if higher_is_better else values
            side.values.append(values)
            side.counted.append(len(values))
            continue
        series = read_steps(run.folder).get(source)
        if series is None:
            raise GateInputError(
                f"{run.folder} has no {source} steps in steps.json (recorded by anemoi-profiler since it has "
                "`compare --fail-if-slower`, with throughput or timing enabled)"
            )
        side.values.append(series.steady())
        side.counted.append(len(series.seconds))
        for name, count in series.flagged().items():
            side.flagged[name] = side.flagged.get(name, 0) + count
    return side


def memory_check(a_runs: list[RunData], b_runs: list[RunData], threshold_pct: float) -> MemoryCheck:
    for figure in MEMORY_FIGURES:
        peaks = [[max(run.series(figure)[1], default=0.0) for run in runs] for runs in (a_runs, b_runs)]
        if all(all(peak > 0 for peak in side) for side in peaks):
            return MemoryCheck(figure, max(peaks[0]), max(peaks[1]), threshold_pct)
    raise GateInputError(f"--fail-if-more-memory: the runs recorded none of {', '.join(MEMORY_FIGURES)} on both sides")


def verdict_lines(verdict: GateVerdict) -> list[str]:
    """The verdict line a CI log shows first, then the evidence."""
    lines = []
    if verdict.mismatches:
        listed = "; ".join(f"{key} (A {a} | B {b})" for key, (a, b) in verdict.mismatches.items())
        keys = " ".join(f"--allow-mismatch {key}" for key in verdict.mismatches)
        lines.append(f"NOT COMPARABLE: the runs differ in what moves step time: {listed}")
        lines.append(f"  to compare anyway: {keys}")
        return lines
    result, label = verdict.result, METRICS[verdict.metric][0]
    if result is not None:
        lines.append(_result_line(result, label))
    if verdict.memory is not None:
        memory = verdict.memory
        state = "MORE MEMORY" if memory.more else "memory within threshold"
        lines.append(
            f"{state}: {memory.figure} {memory.pct:+.1f} % (A {memory.a_mb:.0f} MB, B {memory.b_mb:.0f} MB; "
            f"threshold {memory.threshold_pct:g} %)"
        )
    if result is not None and verdict.sides is not None:
        for name, side, steps, block in zip("AB", verdict.sides, result.steps, result.block_lengths, strict=True):
            flagged = ", ".join(f"{key} {count}" for key, count in side.flagged.items() if count)
            scale = 1000 if METRICS[verdict.metric][1] in ("train", "val") else 1e6
            medians = ", ".join(f"{scale * float(np.median(values)):.4g}" for values in side.values)
            unit = {"train": "ms", "val": "ms"}.get(METRICS[verdict.metric][1], "ms per 1000 samples or items")
            headline = [run.steady(names.TRAIN_STEP_MS) for run in side.runs]
            shown = ", ".join(f"{value:.4g}" for value in headline if value is not None)
            lines.append(
                f"  {name}: {len(side.runs)} run(s), {steps} steady of {sum(side.counted)} values"
                + (f" (left out: {flagged})" if flagged else "")
                + f", median {medians} {unit} (the tested figure), bootstrap block {block}"
                + (f"; the runs' steady-state step time {shown} ms (as their reports show it)" if shown else "")
            )
    for key, (a, b) in verdict.allowed_mismatches.items():
        lines.append(f"  allowed mismatch: {key} (A {a} | B {b})")
    return lines


def _result_line(result: GateResult, label: str) -> str:
    """`VERDICT: <figure> <estimate> (one-sided 95 % bounds <lower> .. <upper>): <why this verdict>`."""
    head = (
        f"{label} {result.estimate_pct:+.1f} % (one-sided 95 % bounds {result.lower_pct:+.1f} % .. "
        f"{result.upper_pct:+.1f} %)"
    )
    threshold = f"the {result.threshold_pct:g} % threshold"
    if result.outcome == "slower":
        return f"SLOWER: {head}: the lower bound is above {threshold}"
    if result.outcome == "not slower":
        return f"NOT SLOWER: {head}: the upper bound is under {threshold}"
    if result.inconclusive_by_drift:
        settle = (
            f"about {result.runs_needed} runs per side, interleaved (A, B, A, B), would settle it"
            if result.runs_needed is not None
            else f"the difference is within the runs' own drift (more than {MAX_RUNS_ADVISED} runs per side would be "
            "needed); to reduce it: a quieter machine, whose runs you measured, and a lower --drift-floor"
        )
        return (
            f"INCONCLUSIVE: {head} hold {threshold} once the drift between runs is counted: with one run per side, "
            f"a run's level can move by {result.drift_pct:.1f} % (the larger of its own block-to-block spread and "
            f"--drift-floor); {settle}"
        )
    if result.more_steps_per_run is not None:
        settle = f"about {result.more_steps_per_run} more steady steps per run (or more runs) would settle it"
    elif result.runs_needed is not None:
        settle = (
            f"more steps cannot; about {result.runs_needed} runs per side, interleaved (A, B, A, B), would settle it"
        )
    else:
        single = result.drift_pct is not None
        settle = (
            f"the difference is within the runs' own noise: no run of up to {MAX_STEPS_ADVISED:,} steady steps"
            + (f" nor {MAX_RUNS_ADVISED} runs per side" if single else "")
            + " would settle it; to reduce the noise: a quieter machine, and "
            + (
                "several runs per side, interleaved (A, B, A, B), whose spread replaces the assumed drift"
                if single
                else "more runs per side, interleaved (A, B, A, B)"
            )
        )
    return f"INCONCLUSIVE: {head} hold {threshold}; this noise detects +{result.detectable_pct:.1f} % or more; {settle}"


def as_json(verdict: GateVerdict) -> dict[str, Any]:
    document: dict[str, Any] = {
        "exit_code": verdict.exit_code,
        "metric": verdict.metric,
        "verdict": verdict_lines(verdict)[0] if verdict_lines(verdict) else "",
        "mismatches": {key: list(values) for key, values in verdict.mismatches.items()},
        "allowed_mismatches": {key: list(values) for key, values in verdict.allowed_mismatches.items()},
    }
    if verdict.result is not None:
        document["slowdown"] = asdict(verdict.result)
    if verdict.sides is not None:
        a, b = verdict.sides
        document["runs"] = {"A": [str(run.folder) for run in a.runs], "B": [str(run.folder) for run in b.runs]}
    if verdict.memory is not None:
        document["memory"] = {**asdict(verdict.memory), "pct": verdict.memory.pct, "more": verdict.memory.more}
    return document


def verdict_html(verdict: GateVerdict, why: list[str]) -> str:
    """The verdict in bold, then the evidence and `why` (`window_evidence.why_lines`) as a list."""
    lines = verdict_lines(verdict)
    if not lines:
        return ""
    evidence = "".join(f"<li>{esc(line.strip())}</li>" for line in [*lines[1:], *why])
    return f"<p class='verdict'><b>{esc(lines[0])}</b></p>" + (f"<ul>{evidence}</ul>" if evidence else "")
