"""Which training log intervals a steady figure has a point for, read from a run folder's `steps.json`."""

from __future__ import annotations

from pathlib import Path

from anemoi_profiler.run_files.steps_file import NOT_STEADY, read_steps


def steady_interval_ends(run_dir: Path, every: int) -> list[int]:
    """The last global step of each training interval of `every` steps that holds a steady step: an interval of
    steps left out only (a profiling window's, the step after its end, the warmup) gets no `time/train/...` point."""
    flags = read_steps(run_dir)["train"].flags
    steady = (flags & NOT_STEADY) == 0
    return [end for end in range(every, len(flags) + 1, every) if steady[end - every : end].any()]
