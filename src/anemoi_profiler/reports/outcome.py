"""What a check of the diagnosis finds: a verdict, why it could not look, or nothing.

Its own module so that checks kept beside `diagnosis` (which lists them all) can make verdicts too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["high", "medium", "info"]
SEVERITY_ORDER: tuple[Severity, ...] = ("high", "medium", "info")


@dataclass(frozen=True)
class Verdict:
    id: str
    """Stable identifier (`dataloader-bound`, `slow-rank`): the MLflow run's `profiler.verdict` tag, for searches."""
    name: str
    """What the report shows."""
    severity: Severity
    value: str
    """The number behind the verdict, with what it was compared to."""
    message: str
    """What it means for this run."""
    next_step: str


@dataclass(frozen=True)
class NotAssessed:
    """A check that the run's data cannot answer, and why (a CPU run has no device memory to compare)."""

    reason: str


Outcome = Verdict | NotAssessed | None
"""What a check finds: a verdict, why it could not look, or None when it looked and found nothing."""
