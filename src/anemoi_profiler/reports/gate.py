"""The decision rule of `compare --fail-if-slower`: is B's typical step slower than A's by more than the threshold?

The estimate is the ratio of B's median steady step to A's (each side: the mean of its runs' log medians). Its
spread comes from a circular block bootstrap of each run's steady steps (blocks as long as the series' lag-1
autocorrelation asks for, so that a slow patch of correlated steps is resampled as one piece, not as independent
evidence; the runs themselves resampled when a side has several), or from an AR(1) model of each run's noise
where that gives more: at a few hundred strongly correlated steps the bootstrap underestimates it by up to a
fifth. With several runs a side, the spread of their medians where that is larger still (the machine slowed some
runs as a whole), with its few degrees of freedom. A side of one run cannot show that: its drift between runs
(`run_drift_variance`: its block-to-block spread, at least `DRIFT_FLOOR_PCT`) is added. One-sided bounds at
`CONFIDENCE` use Student's t with the degrees of freedom of that spread. Outcomes:

- slower: the lower bound is above the threshold;
- not slower: the upper bound is below it;
- inconclusive: the interval holds the threshold; the result says which slowdown this noise could have detected
  and about how many more steps per run would settle it, or, where the drift between runs keeps it open, how many
  runs per side; where neither a reasonable number of steps (`MAX_STEPS_ADVISED`) nor of runs would, that the
  difference is within the runs' own noise.

Torch-free (numpy only); docs/gen_gate_table.py simulates the error rates that docs/regression-gate.md publishes.
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
SPREAD_MARGIN = 1.05
"""The spread is widened by this factor: without it, strongly correlated series (AR(1) ρ = 0.8) gave 5.5-6 %
false 'slower' at the threshold in the simulation of docs/gen_gate_table.py (the t bounds are a little short
where the spread's own estimate is noisy)."""
MIN_STEADY_STEPS = 20
"""Fewer steady steps in a run than this cannot bound a median: the gate refuses to decide."""
DRIFT_FLOOR_PCT = 10.0
"""With one run per side: the least drift assumed between runs of one configuration, as the standard deviation of a
run's median step (%); `compare --drift-floor` sets another. Runs of one script on a shared machine can differ by
more than their steps' noise allows, and nothing inside one run shows that (docs/regression-gate.md)."""
DRIFT_BLOCKS = 8
"""A run's steady steps are cut into this many consecutive blocks (at least `MIN_BLOCK_STEPS` each): the (robust)
spread of their medians beyond what the steps' noise explains is the drift the run itself shows."""
MIN_BLOCK_STEPS = 10
MAD_EFFICIENCY = 0.37
"""The block medians' spread is their median absolute deviation, so that one slow block (a slow start) does not
stand for the run's drift; it is known with this share of a standard deviation's degrees of freedom."""
MAX_RUNS_ADVISED = 20
"""An inconclusive one-run verdict names how many runs per side would settle it, up to this many."""
MAX_STEPS_ADVISED = 1_000_000
"""An inconclusive verdict names how many more steady steps per run would settle it, up to this many: beyond it
(an estimate within a hair of the threshold) the difference is within the runs' own noise, and the advice is to
reduce the noise (more runs per side, a quieter machine), not a run no one can make."""
MAX_RESAMPLED_VALUES = 4_000_000
"""Bootstrap replicates are drawn in chunks of at most this many values (memory stays in the tens of MB)."""

Decision = Literal["slower", "not slower", "inconclusive"]
"""What the gate decides (a diagnosis check's finding is `reports.outcome.Outcome`, another type)."""
EXIT_CODES: dict[Decision, int] = {"not slower": 0, "slower": 1, "inconclusive": 3}


class GateError(ValueError):
    """The data cannot be tested (too few steady steps, a non-positive duration); the message says which."""


@dataclass(frozen=True)
class GateResult:
    outcome: Decision
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
    """Inconclusive: about how many more steady steps each run needs to settle it (at most `MAX_STEPS_ADVISED`);
    None otherwise, or when more steps cannot settle it (`within_noise`, or the drift between runs keeps it open)."""
    drift_pct: float | None = None
    """A side of one run: the drift between runs assumed (the runs' block-to-block spread, or the floor), as the
    standard deviation of a run's median step in %; None when every side has several runs."""
    inconclusive_by_drift: bool = False
    """The steps' noise alone would have decided; the drift between runs it must also hold against does not."""
    runs_needed: int | None = None
    """Inconclusive with a side of one run, where more steps cannot settle it: about how many runs per side
    (interleaved) would; None: more than `MAX_RUNS_ADVISED`, or not asked."""

    @property
    def within_noise(self) -> bool:
        """Inconclusive, and neither a reasonable number of steps nor of runs settles it: the estimate is within
        the runs' own noise of the threshold."""
        return self.outcome == "inconclusive" and self.more_steps_per_run is None and self.runs_needed is None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def judge_slowdown(
    a_runs: list[np.ndarray],
    b_runs: list[np.ndarray],
    threshold_pct: float,
    seed: int = 0,
    resamples: int = RESAMPLES,
    drift_floor_pct: float = DRIFT_FLOOR_PCT,
) -> GateResult:
    """Test 'B is slower than A by more than `threshold_pct` %' on the steady step durations of each run.

    A side of one run cannot show how runs of it drift apart: its drift (`run_drift_variance`: the spread of its
    blocks, at least `drift_floor_pct`) widens the interval."""
    rng = np.random.default_rng(seed)
    sides = [[_log_durations(run) for run in runs] for runs in (a_runs, b_runs)]
    estimates = [float(np.mean([np.median(run) for run in side])) for side in sides]
    replicates = [_side_replicates(side, rng, resamples) for side in sides]
    difference = estimates[1] - estimates[0]
    boot = replicates[1] - replicates[0]
    variances = [[median_variance(run) for run in side] for side in sides]
    modelled = math.sqrt(sum(sum(side) / len(side) ** 2 for side in variances))
    spread = SPREAD_MARGIN * max(float(np.std(boot)), modelled)
    df = _degrees_of_freedom(sides)
    between = _between_runs(sides)
    if between is not None and math.sqrt(between[0]) > spread:
        spread, df = math.sqrt(between[0]), between[1]
    noise_spread, noise_df = spread, df
    drift = [run_drift_variance(side[0], drift_floor_pct) for side in sides if len(side) == 1]
    if drift:
        spread, df = _with_drift(spread, df, drift)
    z = _t_quantile(CONFIDENCE, df)
    lower, upper = difference - z * spread, difference + z * spread
    limit = math.log1p(threshold_pct / 100)
    outcome: Decision = "slower" if lower > limit else "not slower" if upper < limit else "inconclusive"
    more = runs_needed = None
    # The steps alone would decide; the drift between runs does not let them.
    by_drift = outcome == "inconclusive" and bool(drift)
    by_drift = by_drift and abs(difference - limit) > _t_quantile(CONFIDENCE, noise_df) * noise_spread
    if outcome == "inconclusive" and not by_drift:
        per_run = max(len(run) for side in sides for run in side)
        more = _more_steps(abs(difference - limit) / z, noise_spread, sum(variance for variance, _ in drift), per_run)
    if outcome == "inconclusive" and more is None and drift:
        runs_needed = _runs_needed(abs(difference - limit), noise_spread, max(variance for variance, _ in drift))
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
        _pct(math.sqrt(max(variance for variance, _ in drift))) if drift else None,
        by_drift,
        runs_needed,
    )


def run_drift_variance(run: np.ndarray, floor_pct: float = DRIFT_FLOOR_PCT) -> tuple[float, float]:
    """The variance of a run's log median step between runs, and its degrees of freedom: the spread of the run's
    block medians beyond what the steps' noise explains (`DRIFT_BLOCKS`), or the floor where that is larger."""
    floor = math.log1p(floor_pct / 100) ** 2
    blocks = min(DRIFT_BLOCKS, len(run) // MIN_BLOCK_STEPS)
    if blocks < 3:
        return floor, math.inf
    parts = np.array_split(run, blocks)
    _, scale = _robust_centre_and_scale(np.array([np.median(part) for part in parts]))
    explained = float(np.mean([median_variance(part) for part in parts]))
    excess = scale**2 - explained
    return (excess, MAD_EFFICIENCY * (blocks - 1)) if excess > floor else (floor, math.inf)


def _with_drift(spread: float, df: float, drift: list[tuple[float, float]]) -> tuple[float, float]:
    """The spread with each one-run side's drift added, and Welch-Satterthwaite's degrees of freedom."""
    terms = [(spread**2, df), *drift]
    total = sum(variance for variance, _ in terms)
    return math.sqrt(total), total**2 / sum(variance**2 / dof for variance, dof in terms if dof < math.inf)


def _more_steps(allowed_spread: float, noise_spread: float, drift_variance: float, per_run: int) -> int | None:
    """More steady steps per run that would bring the spread under `allowed_spread` (the estimate's distance to
    the threshold over the t quantile); None past `MAX_STEPS_ADVISED`, or where the drift alone is wider.

    Steps shrink the steps' noise (its variance as 1 / steps), not the drift between runs: the drift is taken off
    the allowance first. Without that, a pair whose estimate sat a hair from the threshold asked for ~10^10 steps
    (the distance squared in a denominator), and its reverse, far from the threshold but held open by the drift,
    for tens of thousands of steps that could never settle it."""
    allowance = allowed_spread**2 - drift_variance
    if allowance <= 0:
        return None
    needed = noise_spread**2 / allowance
    if needed > 1 + MAX_STEPS_ADVISED / per_run:
        return None
    return math.ceil(per_run * max(needed - 1, 0.0))


def _runs_needed(distance: float, noise_spread: float, drift_variance: float) -> int | None:
    """Runs per side, interleaved, whose medians' spread would put the threshold `distance` (log) outside the bounds
    if the runs drift as assumed: the spread of a side's mean falls as 1 / runs, with runs - 1 degrees of freedom."""
    for runs in range(2, MAX_RUNS_ADVISED + 1):
        spread = math.sqrt((noise_spread**2 + 2 * drift_variance) / runs)
        if distance > _t_quantile(CONFIDENCE, 2 * runs - 2) * spread:
            return runs
    return None


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
    π σ² / (2n) times the long-run factor of the signs."""
    _, scale = _robust_centre_and_scale(values)
    return math.pi * scale**2 / (2 * len(values)) * _long_run_factor(values)


def _long_run_factor(values: np.ndarray) -> float:
    return _sign_factor(_unbiased_rho(values))


def _unbiased_rho(values: np.ndarray) -> float:
    """ρ corrected for its small-sample bias, -(1 + 3ρ)/n (Kendall)."""
    rho = lag_one_autocorrelation(values)
    return min(rho + (1 + 3 * rho) / len(values), 0.95) if rho > 0 else 0.0


def _sign_factor(rho: float) -> float:
    """1 + 2 Σ_k (2/π) arcsin(ρ^k): how much AR(1) correlation inflates the variance of a median."""
    factor, power = 1.0, rho
    while power > 1e-6:
        factor += 4 / math.pi * math.asin(power)
        power *= rho
    return factor


def _degrees_of_freedom(sides: list[list[np.ndarray]]) -> float:
    """How well the spread itself is known, as the degrees of freedom of a t distribution.

    Each run's modelled variance rests on its MAD (var(ln MAD) ≈ 1.36 / effective steps) and on ρ (var(ρ̂) ≈
    (1 - ρ²) / n, through the factor's slope); Welch-Satterthwaite combines the runs by their variances.
    """
    terms = []
    for side in sides:
        for run in side:
            n, rho = len(run), _unbiased_rho(run)
            step = 0.01
            slope = (math.log(_sign_factor(min(rho + step, 0.96))) - math.log(_sign_factor(max(rho - step, 0.0)))) / (
                2 * step
            )
            relative = 1.36 * 4 * _sign_factor(rho) / n + slope**2 * (1 - rho**2) / n  # var of ln(variance)
            variance = median_variance(run) / len(side) ** 2
            terms.append((variance, 2 / relative))
    total = sum(variance for variance, _ in terms)
    return total**2 / sum(variance**2 / df for variance, df in terms)


def _between_runs(sides: list[list[np.ndarray]]) -> tuple[float, float] | None:
    """The variance of the difference of the sides' mean log medians as the runs' own medians spread (sides of
    several runs), and its Welch-Satterthwaite degrees of freedom; None where no side has two runs.

    Runs a machine slowed as a whole (another job, a clock change) differ by more than their steps' noise says:
    resampling two runs cannot see it, their medians' spread can, with the few degrees of freedom it has.
    """
    terms = []
    for side in sides:
        if len(side) > 1:
            medians = [float(np.median(run)) for run in side]
            terms.append((float(np.var(medians, ddof=1)) / len(side), len(side) - 1))
    total = sum(variance for variance, _ in terms)
    if not total:
        return None
    return total, total**2 / sum(variance**2 / df for variance, df in terms)


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile: by its Cornish-Fisher expansion in 1/df from 10 degrees of freedom (exact to 1e-3
    there), below by bisection on the t distribution's CDF (few degrees: a side of two or three runs)."""
    z = NormalDist().inv_cdf(p)
    if df >= 10:
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    low, high = z, 700.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t²), the incomplete beta by its
    continued fraction."""
    x = df / (df + t * t)
    return 1 - 0.5 * _incomplete_beta(df / 2, 0.5, x)


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta I_x(a, b) (Lentz's continued fraction; Numerical Recipes' betacf)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _incomplete_beta(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-12:
            break
    return front * fraction / a


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


def _side_replicates(side: list[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Bootstrap replicates of a side's mean log median: runs resampled (when there are several), then steps."""
    per_run = np.stack([bootstrap_medians(run, resamples, rng) for run in side])
    if len(side) == 1:
        return per_run[0]
    picked = rng.integers(0, len(side), size=(resamples, len(side)))
    columns = rng.integers(0, resamples, size=(resamples, len(side)))
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
