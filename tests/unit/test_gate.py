"""The decision rule of `compare --fail-if-slower`: outcomes, bounds, and its error rates on synthetic runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from anemoi_profiler.reports.gate import (
    DRIFT_FLOOR_PCT,
    GateError,
    _t_quantile,
    block_length,
    judge_slowdown,
    lag_one_autocorrelation,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS))
from gen_gate_table import DRIFT_ROWS, ROWS, THRESHOLD_PCT, outcomes, synthetic_steps  # noqa: E402


def steps(rng: np.random.Generator, n: int, cv: float, factor: float = 1.0) -> np.ndarray:
    return 0.1 * factor * np.exp(rng.normal(0, cv, n))


@pytest.mark.parametrize(
    ("factor", "outcome", "exit_code"),
    [(1.20, "slower", 1), (1.0, "not slower", 0), (0.9, "not slower", 0), (1.05, "inconclusive", 3)],
)
def test_outcome_and_exit_code_follow_the_bounds(factor: float, outcome: str, exit_code: int) -> None:
    rng = np.random.default_rng(0)
    result = judge_slowdown([steps(rng, 400, 0.03)], [steps(rng, 400, 0.03, factor)], 5.0, drift_floor_pct=0.0)
    assert (result.outcome, result.exit_code) == (outcome, exit_code)
    assert result.lower_pct < result.estimate_pct < result.upper_pct
    assert result.lower_pct < 100 * (factor - 1) < result.upper_pct
    assert result.steps == (400, 400) and result.runs == (1, 1)


def test_inconclusive_says_what_more_steps_would_settle() -> None:
    rng = np.random.default_rng(2)
    result = judge_slowdown([steps(rng, 40, 0.05)], [steps(rng, 40, 0.05, 1.08)], 5.0, drift_floor_pct=0.0)
    assert result.outcome == "inconclusive" and result.more_steps_per_run is not None
    assert result.lower_pct < 5.0 < result.upper_pct and result.detectable_pct > result.estimate_pct
    more = result.more_steps_per_run
    settled = judge_slowdown(
        [steps(rng, 40 + more, 0.05)], [steps(rng, 40 + more, 0.05, 1.08)], 5.0, drift_floor_pct=0.0
    )
    assert settled.outcome == "slower"


def test_correlated_steps_get_longer_blocks_and_a_wider_interval() -> None:
    rng = np.random.default_rng(2)
    shocks = rng.normal(0, 0.03, 2000)
    correlated = np.empty(2000)
    correlated[0] = shocks[0]
    for i in range(1, 2000):
        correlated[i] = 0.8 * correlated[i - 1] + 0.6 * shocks[i]
    independent = rng.normal(0, 0.03, 2000)
    spikes = correlated.copy()
    spikes[::50] += 1.0  # slow outliers do not hide the correlation
    assert lag_one_autocorrelation(spikes) == pytest.approx(lag_one_autocorrelation(correlated), abs=0.05)
    assert block_length(correlated) > 5 * block_length(independent)
    a, b = (
        judge_slowdown([np.exp(independent)], [np.exp(independent[::-1])], 5.0, drift_floor_pct=0.0),
        judge_slowdown([np.exp(correlated)], [np.exp(correlated[::-1])], 5.0, drift_floor_pct=0.0),
    )
    assert (b.upper_pct - b.lower_pct) > 1.5 * (a.upper_pct - a.lower_pct)


def test_several_runs_per_side_resample_the_runs() -> None:
    rng = np.random.default_rng(3)
    drifting_a = [steps(rng, 300, 0.02, factor) for factor in (1.0, 1.06, 0.97)]  # runs differ more than steps
    drifting_b = [steps(rng, 300, 0.02, factor) for factor in (1.02, 0.99, 1.05)]
    one = judge_slowdown(drifting_a[:1], drifting_b[:1], 5.0, drift_floor_pct=0.0)
    several = judge_slowdown(drifting_a, drifting_b, 5.0)
    assert several.runs == (3, 3) and several.steps == (900, 900)
    assert (several.upper_pct - several.lower_pct) > (one.upper_pct - one.lower_pct)


def test_two_runs_a_side_that_the_machine_slowed_as_a_whole_are_inconclusive_not_slower() -> None:
    """Seen in a suite run on a shared 2-core VM: A's runs 1.115 and 1.112 ms, B's 1.442 and 1.692 ms, each run's
    steps steady. Resampling two runs called it 40 % slower; the runs' medians, two degrees of freedom, cannot."""
    rng = np.random.default_rng(5)
    a = [steps(rng, 190, 0.03, 1.115), steps(rng, 190, 0.03, 1.112)]
    b = [steps(rng, 190, 0.03, 1.442), steps(rng, 190, 0.03, 1.692)]
    result = judge_slowdown(a, b, 5.0)
    assert result.outcome == "inconclusive" and result.estimate_pct > 30


def test_several_runs_a_side_that_agree_still_find_a_slowdown() -> None:
    rng = np.random.default_rng(6)
    a = [steps(rng, 300, 0.03, factor) for factor in (1.0, 1.01, 0.99)]
    b = [steps(rng, 300, 0.03, 1.3 * factor) for factor in (1.0, 0.99, 1.01)]
    assert judge_slowdown(a, b, 5.0).outcome == "slower"


@pytest.mark.parametrize(("df", "quantile"), [(1, 6.314), (2, 2.920), (3, 2.353), (5, 2.015), (9, 1.833), (30, 1.697)])
def test_the_t_quantile_is_students(df: float, quantile: float) -> None:
    assert _t_quantile(0.95, df) == pytest.approx(quantile, abs=2e-3)


def test_too_few_steady_steps_or_bad_durations_are_refused() -> None:
    with pytest.raises(GateError, match="5 steady steps in a run; the gate needs at least 20"):
        judge_slowdown([np.ones(5)], [np.ones(50)], 5.0)
    with pytest.raises(GateError, match="zero or negative"):
        judge_slowdown([np.zeros(50)], [np.ones(50)], 5.0)


def test_one_run_per_side_holds_a_verdict_against_the_drift_between_runs() -> None:
    """The issue's false alarm: two runs of one script 9 s apart on the shared VM, +26 % (bounds +12 .. +42 % from
    their steps' noise). The steps alone say slower; the drift that runs of one configuration show does not let
    them, and the result says how many runs per side would settle it."""
    rng = np.random.default_rng(11)
    a, b = [steps(rng, 200, 0.3)], [steps(rng, 200, 0.3, 1.26)]
    assert judge_slowdown(a, b, 5.0, drift_floor_pct=0.0).outcome == "slower"
    result = judge_slowdown(a, b, 5.0)
    assert result.outcome == "inconclusive" and result.inconclusive_by_drift
    assert result.drift_pct is not None and result.drift_pct >= DRIFT_FLOOR_PCT
    assert result.runs_needed is not None and result.runs_needed >= 2 and result.more_steps_per_run is None
    # A large slowdown holds against the drift with one run a side.
    assert judge_slowdown(a, [steps(rng, 200, 0.3, 2.4)], 5.0).outcome == "slower"


def test_a_slow_start_in_one_run_is_not_slower() -> None:
    rng = np.random.default_rng(12)
    slow_start = steps(rng, 300, 0.03)
    slow_start[:60] *= 2  # the first fifth of the steady steps twice as slow
    result = judge_slowdown([steps(rng, 300, 0.03)], [slow_start], 5.0)
    assert result.outcome != "slower"


def test_a_run_that_drifts_within_itself_shows_more_than_the_floor() -> None:
    rng = np.random.default_rng(13)
    drifting = steps(rng, 400, 0.03) * np.linspace(1.0, 1.6, 400)
    result = judge_slowdown([steps(rng, 400, 0.03)], [drifting], 5.0)
    assert result.drift_pct is not None and result.drift_pct > DRIFT_FLOOR_PCT + 2
    several = judge_slowdown([steps(rng, 400, 0.03)] * 2, [steps(rng, 400, 0.03)] * 2, 5.0)
    assert several.drift_pct is None  # several runs a side show their drift as their medians' spread


def test_simulated_drift_between_runs_is_never_called_slower() -> None:
    """Two runs of one configuration, one a side, their levels drifting by the floor (10 %) or starting slowly: at most
    5 % 'slower' (seeded)."""
    for drift, slow_start in ((0.10, 0.0), (0.0, 0.2)):
        found = outcomes(0.03, 0.5, 300, 0.0, 80, 9, drift, 1, slow_start, DRIFT_FLOOR_PCT)
        assert found.count("slower") / len(found) <= 0.05, (drift, slow_start)


def test_simulated_false_slower_rate_at_the_threshold_and_power_at_twice_it() -> None:
    """The issue's acceptance: <= 5 % false 'slower' at exactly the threshold (CV 1-10 %, AR(1), spikes, warmup),
    >= 95 % power at twice the threshold with 300 steady steps at CV 3 %. Seeded: the same pairs every run."""
    for cv, rho in ((0.01, 0.0), (0.03, 0.5), (0.10, 0.8)):
        found = outcomes(cv, rho, 300, THRESHOLD_PCT / 100, pairs=120, seed=7)
        assert found.count("slower") / len(found) <= 0.05, (cv, rho)
    found = outcomes(0.03, 0.5, 300, 2 * THRESHOLD_PCT / 100, pairs=120, seed=8)
    assert found.count("slower") / len(found) >= 0.95


def test_the_synthetic_runs_have_flagged_warmup_and_spikes() -> None:
    seconds, flags = synthetic_steps(np.random.default_rng(4), 300, 0.03, 0.5, 0.0)
    assert len(seconds) == 320 and np.all(flags[:20]) and not np.any(flags[20:])
    assert np.median(seconds[:20]) > 2 * np.median(seconds[20:]) and seconds[20:].max() > 1.5 * np.median(seconds)


def test_the_published_table_meets_the_limits() -> None:
    text = (DOCS / "regression-gate.md").read_text()
    rows = re.findall(r"^\| (\d+)% \| ([\d.]+) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \|", text, flags=re.MULTILINE)
    assert len(rows) == len(ROWS), "run python docs/gen_gate_table.py and put its table in docs/regression-gate.md"
    for cv, _, steps, false_slower, power in rows:
        assert float(false_slower) <= 5.0, (cv, steps)
        if cv == "3" and steps == "300":
            assert float(power) >= 95.0
    drift = re.findall(r"^\| (\d+)% \| (\d) \| (\d+)% \| ([\d.]+)% \|", text, flags=re.MULTILINE)
    assert len(drift) == len(DRIFT_ROWS), "run python docs/gen_gate_table.py: the drift table is not current"
    for level, _, _, slower in drift:
        if float(level) <= DRIFT_FLOOR_PCT:
            assert float(slower) <= 5.0, level
