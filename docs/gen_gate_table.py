"""Simulate the decision rule of `compare --fail-if-slower` on synthetic step series and print its error tables.

`python docs/gen_gate_table.py` prints the two Markdown tables of docs/regression-gate.md ("How often the gate is
wrong"): the steps' noise alone (runs that do not drift, `--drift-floor 0`), then runs that drift apart, with the
default floor; tests/unit/test_gate.py runs the same simulation on a few rows and checks the limits.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from anemoi_profiler.reports.gate import DRIFT_FLOOR_PCT, judge_slowdown
from anemoi_profiler.run_files.steps_file import WARMUP

THRESHOLD_PCT = 5.0
WARMUP_STEPS = 20
SPIKE_RATE = 0.01
"""Share of steps with a spike (2-5 times the step: a garbage collection, a checkpoint, a noisy neighbour)."""
PAIRS = 400
RESAMPLES = 400
ROWS = ((0.01, 0.0, 300), (0.03, 0.0, 300), (0.03, 0.5, 300), (0.05, 0.5, 300), (0.05, 0.8, 300),
        (0.10, 0.5, 300), (0.10, 0.8, 1000), (0.03, 0.5, 100))  # fmt: skip
"""(coefficient of variation, AR(1) coefficient, steady steps) of each row."""
DRIFT_ROWS = ((0.0, 1, 0.0), (0.05, 1, 0.0), (0.10, 1, 0.0), (0.20, 1, 0.0), (0.0, 1, 0.2), (0.10, 3, 0.0))
"""(standard deviation of a run's level between runs, runs per side, share of B's steps in a slow start twice as
slow) of each row of the drift table: 300 steady steps at CV 3 %, AR(1) ρ 0.5."""
DRIFT_PAIRS = 200
LARGE_SLOWDOWN = 0.5


@dataclass(frozen=True)
class Rates:
    false_slower: float
    """'slower' at a true slowdown of exactly the threshold (should be at most 5 %)."""
    power: float
    """'slower' at twice the threshold."""
    inconclusive_at_twice: float
    clear_at_zero: float
    """'not slower' when nothing changed."""


def synthetic_steps(
    rng: np.random.Generator, steps: int, cv: float, rho: float, slowdown: float, slow_start: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """A run's step durations and flags: lognormal AR(1) noise, spikes, a flagged warmup 3 times slower, and a share
    `slow_start` of its steady steps after the warmup twice as slow (a slow start the flags do not catch)."""
    sigma = np.sqrt(np.log1p(cv**2))
    total = steps + WARMUP_STEPS
    shocks = rng.normal(0.0, sigma * np.sqrt(1 - rho**2), total)
    noise = np.empty(total)
    noise[0] = rng.normal(0.0, sigma)
    for i in range(1, total):
        noise[i] = rho * noise[i - 1] + shocks[i]
    seconds = 0.05 * (1 + slowdown) * np.exp(noise)
    spikes = rng.random(total) < SPIKE_RATE
    seconds[spikes] *= rng.uniform(2, 5, spikes.sum())
    flags = np.zeros(total, dtype=np.uint8)
    seconds[:WARMUP_STEPS] *= 3
    flags[:WARMUP_STEPS] = WARMUP
    seconds[WARMUP_STEPS : WARMUP_STEPS + int(slow_start * steps)] *= 2
    return seconds, flags


def outcomes(
    cv: float,
    rho: float,
    steps: int,
    slowdown: float,
    pairs: int,
    seed: int,
    drift: float = 0.0,
    runs: int = 1,
    slow_start: float = 0.0,
    drift_floor_pct: float = 0.0,
) -> list[str]:
    """The gate's outcome for `pairs` simulated pairs of sides of `runs` runs, B slower than A by `slowdown`; each
    run's level drifts by a lognormal factor of standard deviation `drift`, B's runs start slowly."""
    rng = np.random.default_rng(seed)
    found = []
    for pair in range(pairs):
        sides = []
        for side_slowdown, start in ((0.0, 0.0), (slowdown, slow_start)):
            side = []
            for _ in range(runs):
                seconds, flags = synthetic_steps(rng, steps, cv, rho, side_slowdown, start)
                side.append(seconds[flags == 0] * np.exp(rng.normal(0.0, drift)))
            sides.append(side)
        result = judge_slowdown(
            sides[0], sides[1], THRESHOLD_PCT, seed=pair, resamples=RESAMPLES, drift_floor_pct=drift_floor_pct
        )
        found.append(result.outcome)
    return found


def rates(cv: float, rho: float, steps: int, pairs: int = PAIRS, seed: int = 0) -> Rates:
    at_threshold = outcomes(cv, rho, steps, THRESHOLD_PCT / 100, pairs, seed)
    at_twice = outcomes(cv, rho, steps, 2 * THRESHOLD_PCT / 100, pairs, seed + 1)
    at_zero = outcomes(cv, rho, steps, 0.0, pairs, seed + 2)
    return Rates(
        at_threshold.count("slower") / pairs,
        at_twice.count("slower") / pairs,
        at_twice.count("inconclusive") / pairs,
        at_zero.count("not slower") / pairs,
    )


def drift_rates(drift: float, runs: int, slow_start: float, pairs: int = DRIFT_PAIRS, seed: int = 0) -> Rates:
    """The drift table's row: false 'slower' with nothing changed, 'slower' at +50 %, inconclusive and 'not slower'
    with nothing changed (in the `Rates` fields: false_slower, power, inconclusive_at_twice, clear_at_zero)."""
    same = outcomes(0.03, 0.5, 300, 0.0, pairs, seed, drift, runs, slow_start, DRIFT_FLOOR_PCT)
    large = outcomes(0.03, 0.5, 300, LARGE_SLOWDOWN, pairs, seed + 1, drift, runs, slow_start, DRIFT_FLOOR_PCT)
    return Rates(
        same.count("slower") / pairs,
        large.count("slower") / pairs,
        same.count("inconclusive") / pairs,
        same.count("not slower") / pairs,
    )


def render_drift() -> str:
    lines = [
        "| drift between runs | runs per side | B's slow start | 'slower', nothing changed | 'inconclusive', nothing "
        f"changed | 'not slower', nothing changed | 'slower' at +{LARGE_SLOWDOWN:.0%} |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for drift, runs, slow_start in DRIFT_ROWS:
        found = drift_rates(drift, runs, slow_start)
        lines.append(
            f"| {drift:.0%} | {runs} | {slow_start:.0%} | {found.false_slower:.1%} | "
            f"{found.inconclusive_at_twice:.1%} | {found.clear_at_zero:.1%} | {found.power:.1%} |"
        )
    return "\n".join(lines) + "\n"


def render() -> str:
    lines = [
        f"| step CV | AR(1) ρ | steady steps | false 'slower' at +{THRESHOLD_PCT:g} % | 'slower' at "
        f"+{2 * THRESHOLD_PCT:g} % | inconclusive at +{2 * THRESHOLD_PCT:g} % | 'not slower' at 0 % |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cv, rho, steps in ROWS:
        found = rates(cv, rho, steps)
        lines.append(
            f"| {cv:.0%} | {rho:g} | {steps} | {found.false_slower:.1%} | {found.power:.1%} | "
            f"{found.inconclusive_at_twice:.1%} | {found.clear_at_zero:.1%} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render() + "\n" + render_drift())
