"""Each training and validation step's host duration, kept for `compare --fail-if-slower` (`steps.json`).

A step's duration is the host time from the previous batch's end to its own end, as the stage clock's batch
hooks see them: the whole cycle a step costs (data fetch, forward, backward, optimizer, other callbacks), what
throughput is made of. Recording is one `perf_counter` read and two stores into arrays allocated up front (grown
by doubling when a run is longer); nothing is written until the run's end. On CUDA the
host runs ahead of the device, but only by a bounded queue: over a steady run its step times follow the
device's, and they never wait for it (no sync).

Steps that are not steady state carry flags (`reports/step_series.FLAGS`); callers mark what happens inside a
step with `mark(...)` and the flag lands on the step that ends next. Only rank 0 writes its record: in data
parallel training every step ends with the gradient all-reduce, so rank 0's step is the job's step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anemoi_profiler.clock.own_work import OwnWorkClock
from anemoi_profiler.run_files.steps_file import AFTER_OTHER_STAGE, OWN_WORK, WARMUP, write_steps

INITIAL_CAPACITY = 4096
CLOCK = "host perf_counter, batch end to batch end"


class StageSteps:
    """One stage's durations and flags; `restart(at)` begins a new run of consecutive steps (after a pause)."""

    def __init__(self) -> None:
        self.seconds = np.empty(INITIAL_CAPACITY, dtype=np.float64)
        self.flags = np.empty(INITIAL_CAPACITY, dtype=np.uint8)
        self.count = 0
        self.last_end: float | None = None
        self.pending = 0
        """Flags for the step in progress, set by `mark` and stored with its duration."""

    def restart(self, at: float) -> None:
        self.last_end = at
        self.pending |= AFTER_OTHER_STAGE

    def step_ended(self, now: float, flags: int) -> int:
        """Record the step that ended at `now`; its flags (0: steady)."""
        flags |= self.pending
        if self.last_end is not None:
            if self.count == len(self.seconds):
                self.seconds = np.resize(self.seconds, 2 * self.count)
                self.flags = np.resize(self.flags, 2 * self.count)
            self.seconds[self.count] = now - self.last_end
            self.flags[self.count] = flags
            self.count += 1
        self.pending = 0
        self.last_end = now
        return flags

    def recorded(self) -> tuple[np.ndarray, np.ndarray]:
        return self.seconds[: self.count], self.flags[: self.count]


class StepRecord:
    """The session's record of both stages; the stage clock calls it from its batch hooks."""

    def __init__(self, own_work: OwnWorkClock, warmup_steps: int) -> None:
        self.stages = {"train": StageSteps(), "val": StageSteps()}
        self._own_work = own_work
        self._own_work_seen = 0.0
        self._warmup_steps = warmup_steps
        self._train_steps = 0

    def mark(self, stage: str, flag: int) -> None:
        """Flag the step of `stage` in progress (a profiler window, a checkpoint save)."""
        self.stages[stage].pending |= flag

    def stage_started(self, stage: str, at: float) -> None:
        """A stage starts (or resumes after the other): its next step is timed from `at` and flagged."""
        self.stages[stage].restart(at)

    def train_step_ended(self, now: float) -> int:
        """Record a training step; its flags, which also leave it out of the steady figures (`StageMeter.leave_out`)."""
        self._train_steps += 1
        flags = WARMUP if self._train_steps <= self._warmup_steps else 0
        return self.stages["train"].step_ended(now, flags | self._own_work_flag())

    def val_step_ended(self, now: float) -> None:
        self.stages["val"].step_ended(now, self._own_work_flag())

    def _own_work_flag(self) -> int:
        total = self._own_work.total_s
        if total == self._own_work_seen:
            return 0
        self._own_work_seen = total
        return OWN_WORK

    def write(self, run_dir: Path, rank: int) -> Path | None:
        """`steps.json` in the run folder; None when no step was timed (no interval callback drove the clock)."""
        if not any(steps.count for steps in self.stages.values()):
            return None
        return write_steps(run_dir, {name: steps.recorded() for name, steps in self.stages.items()}, rank, CLOCK)
