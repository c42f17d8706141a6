"""Simulate the decision rule of `compare --fail-if-slower` on synthetic step series and print its error table.

`python docs/gen_gate_table.py` prints the Markdown table of docs/regression-gate.md ("How often the gate is wrong");
tests/test_gate.py runs the same simulation on a few rows and checks the limits.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from anemoi_profiler.reports.gate import judge_slowdown
from anemoi_profiler.reports.step_series import WARMUP

THRESHOLD_PCT = 5.0
WARMUP_STEPS = 20
SPIKE_RATE = 0.01
"""Share of steps with a spike (2-5 times the step: a garbage collection, a checkpoint, a noisy neighbour)."""
PAIRS = 400
RESAMPLES = 400
ROWS = ((0.01, 0.0, 300), (0.03, 0.0, 300), (0.03, 0.5, 300), (0.05, 0.5, 300), (0.05, 0.8, 300),
        (0.10, 0.5, 300), (0.10, 0.8, 1000), (0.03, 0.5, 100))  # fmt: skip
"""(coefficient of variation, AR(1) coefficient, steady steps) of each row."""


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
    rng: np.random.Generator, steps: int, cv: float, rho: float, slowdown: float
) -> tuple[np.ndarray, np.ndarray]:
    """A run's step durations and flags: lognormal AR(1) noise, spikes, and a flagged warmup 3 times slower."""
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
    return seconds, flags


def outcomes(cv: float, rho: float, steps: int, slowdown: float, pairs: int, seed: int) -> list[str]:
    """The gate's outcome for `pairs` simulated pairs of runs, B slower than A by `slowdown`."""
    rng = np.random.default_rng(seed)
    found = []
    for pair in range(pairs):
        a, b = (synthetic_steps(rng, steps, cv, rho, s) for s in (0.0, slowdown))
        steady_a, steady_b = (seconds[flags == 0] for seconds, flags in (a, b))
        result = judge_slowdown([steady_a], [steady_b], THRESHOLD_PCT, seed=pair, resamples=RESAMPLES)
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
    sys.stdout.write(render())
