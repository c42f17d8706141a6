"""The gate and the table speak one language: REGRESSION only where the gate exits 1, advice a user can follow,
and small figures under absolute floors (issue 53, item 3). Constructed runs: no fit."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from anemoi_profiler import names
from anemoi_profiler.cli.compare_command import gate_failed
from anemoi_profiler.reports.compare import (
    DATA_WAIT_FLOOR_MS,
    UNSETTLED,
    Comparison,
    Difference,
    GateFailed,
    compare_runs,
    format_text,
    render_html,
)
from anemoi_profiler.reports.gate import MAX_STEPS_ADVISED, judge_slowdown
from anemoi_profiler.reports.regression_gate import GateVerdict, verdict_lines
from anemoi_profiler.reports.run_data import RunData


def steps(rng: np.random.Generator, n: int, cv: float, factor: float = 1.0) -> np.ndarray:
    return 0.305 * factor * np.exp(rng.normal(0, cv, n))


def run(name: str, **steady: float) -> RunData:
    """A run folder's steady figures, as its `summary/...` metrics hold them."""
    metrics = {names.summary_of(key): {"step": [100], "value": [value]} for key, value in steady.items()}
    return RunData(Path(name), metrics=metrics)


def slower_runs() -> tuple[RunData, RunData]:
    """B with a sleep added to every step: -40 % samples/s, +67 % step time."""
    a = run("a", **{names.TRAIN_SAMPLES_PER_SEC: 100.0, names.TRAIN_STEP_MS: 300.0})
    b = run("b", **{names.TRAIN_SAMPLES_PER_SEC: 60.0, names.TRAIN_STEP_MS: 500.0})
    return a, b


def verdict_of(outcome_factor: float, runs_a_side: int, seed: int = 0) -> GateVerdict:
    rng = np.random.default_rng(seed)
    a = [steps(rng, 300, 0.03) for _ in range(runs_a_side)]
    b = [steps(rng, 300, 0.03, outcome_factor) for _ in range(runs_a_side)]
    return GateVerdict("step", {}, {}, result=judge_slowdown(a, b, 5.0))


def gated_output(verdict: GateVerdict, comparison: Comparison) -> str:
    """What `compare --fail-if-slower` prints: the verdict lines, then the table."""
    return "\n".join(verdict_lines(verdict)) + "\n" + format_text(comparison, gate_failed(verdict), True)


def test_an_inconclusive_gate_leaves_slower_rows_unsettled() -> None:
    verdict = verdict_of(1.05, 1)  # one run a side at the threshold: the drift between runs keeps it open
    assert verdict.exit_code == 3 and gate_failed(verdict) is None
    comparison = compare_runs(*slower_runs())
    assert {d.label for d in comparison.worse} == {"training samples/s", "training step"}
    text = gated_output(verdict, comparison)
    assert "REGRESSION" not in text
    step_line = next(line for line in text.splitlines() if line.startswith("training step "))
    assert step_line.rstrip().endswith(UNSETTLED)
    assert "2 figure(s) worse than A by more than 5%, not settled (the gate above did not settle them)" in text
    page = render_html(comparison, "<p>INCONCLUSIVE</p>", gate_failed(verdict))
    assert "REGRESSION" not in page and f"<td>{UNSETTLED}</td>" in page


def test_a_not_slower_gate_and_plain_compare_say_no_regression() -> None:
    comparison = compare_runs(*slower_runs())
    not_slower = verdict_of(1.0, 3)
    assert not_slower.exit_code == 0
    assert "REGRESSION" not in gated_output(not_slower, comparison)
    plain = format_text(comparison)  # no gate: one value per run is not tested against noise
    assert "REGRESSION" not in plain and UNSETTLED in plain and "--fail-if-slower tests that" in plain


def test_a_real_regression_is_flagged_and_exits_one() -> None:
    verdict = verdict_of(1.3, 3)
    assert verdict.exit_code == 1 and gate_failed(verdict) == GateFailed(slower=True)
    text = gated_output(verdict, compare_runs(*slower_runs()))
    assert text.startswith("SLOWER: training step +")
    step_line = next(line for line in text.splitlines() if line.startswith("training step "))
    assert step_line.rstrip().endswith("REGRESSION")
    assert "2 REGRESSION(S) (B worse than A by more than 5%, as the gate found): training samples/s -40.0%" in text


def test_memory_rows_are_regressions_only_when_the_memory_check_fails() -> None:
    more = Difference("peak allocated (GPU)", 100.0, 200.0, "MB", False, 5.0)
    step = Difference("training step", 100.0, 200.0, "ms", False, 5.0)
    assert (more.word(GateFailed(slower=True)), step.word(GateFailed(slower=True))) == (UNSETTLED, "REGRESSION")
    assert (more.word(GateFailed(more_memory=True)), step.word(GateFailed(more_memory=True))) == (
        "REGRESSION",
        UNSETTLED,
    )
    assert more.word(None) == UNSETTLED and Difference("x", 100.0, 50.0, "ms", False, 5.0).word() == "improvement"


@pytest.mark.parametrize(
    ("wait_a", "wait_b", "step_ms", "status"),
    [
        (0.05, 0.185, 305.0, ""),  # +0.135 ms on a 305 ms step: +270 %, under a millisecond
        (0.5, 2.5, 305.0, ""),  # +2 ms: over a millisecond, under 1 % of the step
        (10.0, 30.0, 305.0, "regression"),  # +20 ms: 7 % of the step
        (0.5, 1.8, 50.0, "regression"),  # +1.3 ms on a 50 ms step: 2.6 % of it
    ],
)
def test_a_small_data_wait_is_no_regression(wait_a: float, wait_b: float, step_ms: float, status: str) -> None:
    a = run("a", **{names.TRAIN_DATALOADER_WAIT_MS: wait_a, names.TRAIN_STEP_MS: step_ms})
    b = run("b", **{names.TRAIN_DATALOADER_WAIT_MS: wait_b, names.TRAIN_STEP_MS: step_ms})
    (wait,) = [d for d in compare_runs(a, b).metrics if d.label == "dataloader wait"]
    assert wait.min_delta >= DATA_WAIT_FLOOR_MS and wait.status == status


def largest_advised(line: str) -> int:
    """The largest count the verdict asks a user to run (steps or runs)."""
    counts = re.findall(r"about ([\d,]+) (?:more steady steps|runs)", line)
    return max((int(count.replace(",", "")) for count in counts), default=0)


@pytest.mark.parametrize("floor", [10.0, 0.0])
def test_advice_is_capped_both_ways_for_an_estimate_at_the_threshold(floor: float) -> None:
    """An estimate a hair from the threshold asked for ~10^10 more steps (the distance to the threshold squared in
    a denominator), its reverse for tens of thousands that the drift between runs would not let settle it."""
    rng = np.random.default_rng(0)
    a, b = steps(rng, 300, 0.03), steps(rng, 300, 0.03, 1.0499)
    for x, y in ((a, b), (b, a)):
        result = judge_slowdown([x], [y], 5.0, drift_floor_pct=floor)
        if result.outcome != "inconclusive":
            continue
        line = verdict_lines(GateVerdict("step", {}, {}, result=result))[0]
        assert largest_advised(line) <= MAX_STEPS_ADVISED, line
        assert result.more_steps_per_run is None or result.more_steps_per_run <= MAX_STEPS_ADVISED
        if result.within_noise:
            assert "within the runs' own noise" in line and "runs per side, interleaved" in line, line


def test_an_estimate_exactly_on_the_threshold_is_within_noise() -> None:
    rng = np.random.default_rng(1)
    a = [steps(rng, 300, 0.03) for _ in range(3)]
    result = judge_slowdown(a, [run * 1.05 for run in a], 5.0)
    assert result.outcome == "inconclusive" and result.within_noise and result.more_steps_per_run is None
    line = verdict_lines(GateVerdict("step", {}, {}, result=result))[0]
    assert "the difference is within the runs' own noise: no run of up to 1,000,000 steady steps would" in line


def test_two_runs_of_one_script_never_say_regression_unless_the_gate_exits_one() -> None:
    """The issue's property, on seeded pairs of one configuration (one and three runs a side)."""
    comparison = compare_runs(*slower_runs())  # whatever the table's single values say
    for seed in range(6):
        for runs_a_side in (1, 3):
            verdict = verdict_of(1.0, runs_a_side, seed)
            text = gated_output(verdict, comparison)
            assert ("REGRESSION" in text) == (verdict.exit_code == 1), text
            assert largest_advised(text) <= MAX_STEPS_ADVISED, text
