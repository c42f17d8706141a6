"""Window arithmetic for torch.profiler schedules: which batches a window covers and whether a run fits it.

The profiler is started only at batch `skip_first` and stopped after its last cycle, so the batches outside
that span cost one integer comparison. Its step numbers still count from the first batch of the stage, so
`ProfilerStep#<n>` in a trace is the batch index `n`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from anemoi_profiler.config_sections import WindowConfig


@dataclass(frozen=True)
class WindowSchedule:
    """`skip_first` batches, then `repeat` cycles (0: until the stage ends) of wait, warmup and active batches."""

    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int

    @classmethod
    def from_config(cls, window: WindowConfig) -> WindowSchedule:
        return cls(window.skip_first, window.wait, window.warmup, window.active, window.repeat)

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def start(self) -> int:
        """Index of the first batch the profiler sees."""
        return self.skip_first

    @property
    def end(self) -> float:
        """Index of the first batch after the last cycle (infinite when `repeat` is 0)."""
        return self.skip_first + self.repeat * self.cycle if self.repeat else math.inf

    def starts_cycle(self, batch: int) -> bool:
        """True for the first batch of a cycle: the last moment to warn about the coming window."""
        return batch >= self.skip_first and (batch - self.skip_first) % self.cycle == 0

    def completed_windows(self, batches: int) -> int:
        """How many windows a stage of `batches` batches records to the end."""
        full = max(0, (batches - self.skip_first) // self.cycle)
        return min(full, self.repeat) if self.repeat else full

    def shortfall(self, batches: int, key: str, run: str) -> str | None:
        """A warning when `batches` cannot complete the windows asked for; None when they fit."""
        wanted = self.repeat or 1
        completed = self.completed_windows(batches)
        if completed >= wanted:
            return None
        needed = self.skip_first + wanted * self.cycle
        what = "a window needs" if wanted == 1 else f"{wanted} windows need"
        result = "no window completes" if completed == 0 else f"only {completed} complete"
        return (
            f"{key}: {what} {needed} batches (skip_first={self.skip_first} + cycles of wait={self.wait}, "
            f"warmup={self.warmup}, active={self.active}), {run} has {batches}: {result}. "
            f"Lower {key}.skip_first/wait/repeat or profile a longer run."
        )

    def torch_schedule(self) -> Callable[[int], Any]:
        return torch.profiler.schedule(
            skip_first=self.skip_first, wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat
        )
