"""The decision rule of `compare --fail-if-slower`: is B's typical step slower than A's by more than the threshold?

The estimate is the ratio of B's median steady step to A's. Its confidence interval comes from a circular block
bootstrap of each run's steady steps (blocks as long as the series' autocorrelation asks for, so that a slow
patch of correlated steps is resampled as one piece, not as independent evidence); with several runs per side the
runs are resampled too, and each side's figure is the mean of its runs' log medians. Three outcomes:

- slower: the one-sided lower confidence bound is above the threshold;
- not slower: the one-sided upper bound is below it;
- inconclusive: the interval holds the threshold; the result says which slowdown this noise could have detected
  and about how many more steps per run would settle it.

Torch-free (numpy only); docs/reports.md has the simulation that checks the error rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

CONFIDENCE = 0.95
"""One-sided: a 'slower' verdict at a true slowdown of exactly the threshold comes at most this rarely wrong."""
RESAMPLES = 2000
MIN_STEADY_STEPS = 20
"""Fewer steady steps in a run than this cannot bound a median: the gate refuses to decide."""
MAX_RESAMPLED_VALUES = 4_000_000
"""Bootstrap replicates are drawn in chunks of at most this many values (memory stays in the tens of MB)."""

Outcome = Literal["slower", "not slower", "inconclusive"]
EXIT_CODES: dict[Outcome, int] = {"not slower": 0, "slower": 1, "inconclusive": 3}


class GateError(ValueError):
    """The data cannot be tested (too few steady steps, a non-positive duration); the message says which."""


@dataclass(frozen=True)
class GateResult:
    outcome: Outcome
    threshold_pct: float
    estimate_pct: float
    lower_pct: float
    """One-sided lower bound at `CONFIDENCE`."""
    upper_pct: float
    """One-sided upper bound at `CONFIDENCE`."""
    steps: tuple[int, int]
    """Steady steps of A and of B (all runs of a side together)."""
    runs: tuple[int, int]
    block_lengths: tuple[int, int]
    """The longest bootstrap block of a side's runs."""
    detectable_pct: float
    """The smallest slowdown that this noise calls 'slower' with probability `CONFIDENCE`."""
    more_steps_per_run: int | None
    """Inconclusive: about how many more steady steps each run needs to settle it; None otherwise, or when the
    estimate sits on the threshold."""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def judge_slowdown(
    a_runs: list[np.ndarray], b_runs: list[np.ndarray], threshold_pct: float, seed: int = 0
) -> GateResult:
    """Test 'B is slower than A by more than `threshold_pct` %' on the steady step durations of each run."""
    rng = np.random.default_rng(seed)
    sides = [[_log_durations(run) for run in runs] for runs in (a_runs, b_runs)]
    estimates = [float(np.mean([np.median(run) for run in side])) for side in sides]
    replicates = [_side_replicates(side, rng) for side in sides]
    difference = estimates[1] - estimates[0]
    boot = replicates[1] - replicates[0]
    # The block bootstrap underestimates the spread of a strongly correlated series' median by up to a fifth at
    # a few hundred steps; the AR(1) model of each run's noise then gives the larger, and the larger decides.
    modelled = math.sqrt(sum(sum(median_variance(run) for run in side) / len(side) ** 2 for side in sides))
    spread = max(float(np.std(boot)), modelled)
    z = NormalDist().inv_cdf(CONFIDENCE)
    lower, upper = difference - z * spread, difference + z * spread
    limit = math.log1p(threshold_pct / 100)
    outcome: Outcome = "slower" if lower > limit else "not slower" if upper < limit else "inconclusive"
    more = None
    if outcome == "inconclusive" and abs(difference - limit) > 0:
        needed = (spread * z / abs(difference - limit)) ** 2  # variance shrinks as 1 / steps
        per_run = max(len(run) for side in sides for run in side)
        more = math.ceil(per_run * max(needed - 1, 0.0))
    return GateResult(
        outcome,
        threshold_pct,
        _pct(difference),
        _pct(lower),
        _pct(upper),
        (sum(len(run) for run in sides[0]), sum(len(run) for run in sides[1])),
        (len(sides[0]), len(sides[1])),
        (max(block_length(run) for run in sides[0]), max(block_length(run) for run in sides[1])),
        _pct(limit + 2 * z * spread),
        more,
    )


def block_length(values: np.ndarray) -> int:
    """Carlstein's block length for an AR(1)-like series, (2ρ/(1-ρ²))^(2/3) n^(1/3), from its lag-1
    autocorrelation ρ (1 for an uncorrelated series; at most a quarter of the series)."""
    n = len(values)
    rho = lag_one_autocorrelation(values)
    length = (2 * rho / (1 - rho**2)) ** (2 / 3) * n ** (1 / 3)
    return int(min(max(1, math.ceil(length)), max(1, n // 4)))


def lag_one_autocorrelation(values: np.ndarray) -> float:
    """ρ of the series with its spikes (beyond 5 robust standard deviations) set to its median, in [0, 0.95]:
    a few slow outliers, uncorrelated, would otherwise hide the correlation of the rest."""
    centre, scale = _robust_centre_and_scale(values)
    tamed = np.where(np.abs(values - centre) > 5 * scale, centre, values)
    centred = tamed - tamed.mean()
    variance = float(centred @ centred)
    rho = float(centred[1:] @ centred[:-1]) / variance if variance > 0 and len(values) > 2 else 0.0
    return min(max(rho, 0.0), 0.95)


def median_variance(values: np.ndarray) -> float:
    """The median's variance if the series were Gaussian AR(1) noise with its robust scale and ρ:
    π σ² / (2n) times the long-run factor of the signs, 1 + 2 Σ_k (2/π) arcsin(ρ^k)."""
    _, scale = _robust_centre_and_scale(values)
    rho = lag_one_autocorrelation(values)
    factor, power = 1.0, rho
    while power > 1e-6:
        factor += 4 / math.pi * math.asin(power)
        power *= rho
    return math.pi * scale**2 / (2 * len(values)) * factor


def _robust_centre_and_scale(values: np.ndarray) -> tuple[float, float]:
    centre = float(np.median(values))
    return centre, 1.4826 * float(np.median(np.abs(values - centre)))


def bootstrap_medians(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of `resamples` circular block bootstrap replicates of `values` (vectorised, in chunks)."""
    n = len(values)
    length = block_length(values)
    blocks = math.ceil(n / length)
    offsets = np.arange(length)
    chunk = max(1, MAX_RESAMPLED_VALUES // (blocks * length))
    medians = np.empty(resamples)
    for begin in range(0, resamples, chunk):
        count = min(chunk, resamples - begin)
        starts = rng.integers(0, n, size=(count, blocks))
        index = ((starts[:, :, None] + offsets) % n).reshape(count, -1)[:, :n]
        medians[begin : begin + count] = np.median(values[index], axis=1)
    return medians


def _side_replicates(side: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of a side's mean log median: runs resampled (when there are several), then steps."""
    per_run = np.stack([bootstrap_medians(run, RESAMPLES, rng) for run in side])
    if len(side) == 1:
        return per_run[0]
    picked = rng.integers(0, len(side), size=(RESAMPLES, len(side)))
    columns = rng.integers(0, RESAMPLES, size=(RESAMPLES, len(side)))
    return per_run[picked, columns].mean(axis=1)


def _log_durations(run: np.ndarray) -> np.ndarray:
    values = np.asarray(run, dtype=np.float64)
    if len(values) < MIN_STEADY_STEPS:
        raise GateError(f"{len(values)} steady steps in a run; the gate needs at least {MIN_STEADY_STEPS}")
    if not np.all(values > 0):
        raise GateError("a step duration is zero or negative")
    return np.log(values)


def _pct(log_ratio: float) -> float:
    return 100 * math.expm1(log_ratio)
