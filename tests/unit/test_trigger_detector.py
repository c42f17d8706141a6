"""The trigger detectors on synthetic step-time, wait and memory series: false alarms and detection delay."""

from __future__ import annotations

import math
import random

import pytest

from anemoi_profiler.triggers.detector import (
    DriftDetector,
    IntervalFigures,
    MemoryClimbDetector,
    SlowRankDetector,
    Triggers,
)

LOG_EVERY = 50


def drift_detector() -> DriftDetector:
    """The defaults of the `triggers` config section."""
    return DriftDetector(warmup=2, baseline_intervals=20, min_slowdown=0.05, sigmas=3.5, confirm=2)


def step_times(
    rng: random.Random,
    steps: int,
    cv: float = 0.05,
    phi: float = 0.5,
    spike_p: float = 0.002,
    change_at: int | None = None,
    change: float = 1.10,
) -> list[float]:
    """Per-step times (ms): AR(1) log-normal noise, rare 3x spikes, a slow warmup, an optional step change."""
    times, noise = [], 0.0
    innovation = cv * math.sqrt(1 - phi * phi)
    for step in range(steps):
        noise = phi * noise + rng.gauss(0, innovation)
        time_ms = 100.0 * math.exp(noise) * (1 + 2 * math.exp(-step / 20))
        if rng.random() < spike_p:
            time_ms *= 3
        if change_at is not None and step >= change_at:
            time_ms *= change
        times.append(time_ms)
    return times


def interval_means(times: list[float]) -> list[float]:
    return [sum(times[i : i + LOG_EVERY]) / LOG_EVERY for i in range(0, len(times) - LOG_EVERY + 1, LOG_EVERY)]


NOISE = {
    "white noise": {"cv": 0.08, "phi": 0.0, "spike_p": 0.0},
    "spikes": {"cv": 0.03, "phi": 0.0, "spike_p": 0.005},
    "autocorrelated": {"cv": 0.05, "phi": 0.8, "spike_p": 0.002},
    "autocorrelated with spikes": {"cv": 0.05, "phi": 0.5, "spike_p": 0.005},
}


@pytest.mark.parametrize("noise", NOISE)
def test_drift_fires_at_most_once_per_10000_stationary_steps(noise: str) -> None:
    rng = random.Random(7)
    steps = fires = 0
    for _ in range(5):
        detector = drift_detector()
        intervals = interval_means(step_times(rng, 40_000, **NOISE[noise]))
        fires += sum(detector.feed(value) is not None for value in intervals)
        steps += len(intervals) * LOG_EVERY
    assert fires / steps * 10_000 <= 1.0, (fires, steps)


def test_drift_catches_a_10_percent_slowdown_within_two_intervals() -> None:
    rng = random.Random(11)
    delays = []
    for _ in range(100):
        detector = drift_detector()
        intervals = interval_means(step_times(rng, 3_000, change_at=2_000))  # interval 40 is the first slower one
        fired = [index for index, value in enumerate(intervals) if detector.feed(value) is not None]
        delays.append(fired[0] - 40 + 1 if fired else None)
    caught = sum(delay in (1, 2) for delay in delays)
    assert caught >= 95, delays


def test_drift_evidence_names_the_baseline_and_threshold() -> None:
    detector = drift_detector()
    trigger = None
    for value in [100.0, 101.0] * 8 + [112.0, 113.0]:
        trigger = detector.feed(value) or trigger
    assert trigger is not None and trigger.reason == "drift" and trigger.ranks == ()
    evidence = trigger.evidence
    assert 100.0 <= evidence.baseline_median <= 101.0
    assert evidence.threshold == pytest.approx(evidence.baseline_median * 1.05)
    assert evidence.value == pytest.approx(112.0)


def test_drift_ignores_a_single_slow_interval_and_a_speedup() -> None:
    detector = drift_detector()
    series = [100.0, 101.0] * 8 + [150.0] + [100.0] * 5 + [80.0] * 10
    assert all(detector.feed(value) is None for value in series)


def test_drift_learns_the_new_step_time_before_firing_again() -> None:
    detector = drift_detector()
    fired = [detector.feed(value) is not None for value in [100.0] * 10 + [120.0] * 30]
    assert fired.count(True) == 1


def rank_waits(rng: random.Random, ranks: int, lagging: int | None, lag_ms: float) -> list[float]:
    """Waits (ms) per step in the gradient all-reduce: noise, and a lagging rank that the others wait for."""
    waits = [5.0 + abs(rng.gauss(0, 1.0)) for _ in range(ranks)]
    if lagging is not None:
        waits = [wait + (0.0 if rank == lagging else lag_ms) for rank, wait in enumerate(waits)]
    return waits


def slow_rank_detector() -> SlowRankDetector:
    return SlowRankDetector(warmup=2, baseline_intervals=20, min_lag=0.10, sigmas=3.5, confirm=2)


def test_slow_rank_is_quiet_while_the_ranks_take_turns() -> None:
    rng = random.Random(3)
    detector = slow_rank_detector()
    fires = sum(detector.feed(rank_waits(rng, 8, None, 0.0), 100.0) is not None for _ in range(2_000))
    assert fires == 0  # 100,000 steps


def test_slow_rank_names_the_culprit_a_median_rank_and_rank_0() -> None:
    rng = random.Random(5)
    detector = slow_rank_detector()
    for _ in range(20):
        assert detector.feed(rank_waits(rng, 8, None, 0.0), 100.0) is None
    first = detector.feed(rank_waits(rng, 8, 5, 20.0), 120.0)
    second = detector.feed(rank_waits(rng, 8, 5, 20.0), 120.0)
    assert first is None and second is not None
    assert second.reason == "slow-rank"
    assert 5 in second.ranks and 0 in second.ranks and len(second.ranks) == 3
    assert second.evidence.value > second.evidence.threshold >= 0.10


def test_memory_climb_fires_on_the_climbing_rank_only() -> None:
    rng = random.Random(9)
    detector = MemoryClimbDetector(warmup=2, intervals=5, min_growth=0.05)
    assert detector.feed([1000.0, 1000.0]) is None and detector.feed([2000.0, 2000.0]) is None  # warmup
    for _ in range(1_000):  # resident memory with noise, stationary
        assert detector.feed([2000 + rng.gauss(0, 10), 2000 + rng.gauss(0, 10)]) is None
    fired = [detector.feed([2000 + rng.gauss(0, 10), 2000 + 30.0 * i]) for i in range(1, 8)]
    trigger = next(t for t in fired if t is not None)
    assert fired.index(trigger) <= 4  # five rising readings at most (earlier noise may have been rising too)
    assert trigger.reason == "memory" and trigger.ranks == (1,)
    assert trigger.evidence.value > trigger.evidence.threshold


def test_triggers_keep_the_cooldown_and_the_maximum() -> None:
    triggers = Triggers(drift_detector(), None, None, cooldown_steps=1_000, max_windows=2)
    opened = []
    step = 0
    for level in [100.0, 130.0, 170.0, 220.0, 290.0]:
        for _ in range(12):
            step += LOG_EVERY
            if triggers.observe(IntervalFigures(step, level, None, [])) is not None:
                opened.append(step)
    assert len(opened) == 2 and opened[1] - opened[0] >= 1_000
    assert triggers.windows_left == 0 and triggers.last is not None and triggers.last[0] == opened[1]
