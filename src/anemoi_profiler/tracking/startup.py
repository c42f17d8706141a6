"""Switches the benchmark harness uses to measure the profiler's start-up and hot-path tricks one by one."""

from __future__ import annotations

import os

WITHOUT_VARIABLE = "_ANEMOI_PROFILER_WITHOUT"
"""Comma-separated tricks to leave out; set only by benchmarks/startup_tricks.py."""


def uses(trick: str) -> bool:
    return trick not in os.environ.get(WITHOUT_VARIABLE, "").split(",")
