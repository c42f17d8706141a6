"""What a profiled fit adds to each step on the training thread, read within the fit (see `StepParts`)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure import Callback


class StepParts(Callback):
    """Over batches `first`-`last` of a fit: the training thread's time in callback hooks as Lightning calls
    them (its dispatch included) and in the trainer's profiler calls (around every fetch), and its time
    waiting for a core (Linux `schedstat`), each per batch.

    Bare and profiled fits both carry it, so the difference of the two is what the profiler's hooks, its stand-in
    for the trainer's profiler and whatever took the training thread's core add to a step. Both are read within
    one fit, as a share of that fit's own steps, so a machine whose speed drifts between fits scales both alike.
    Not seen: work on another core that slows this one through shared caches or memory bandwidth. Put it last.
    """

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.batches = 0
        self.counting = False
        self.in_calls_ns = 0
        self.schedstat: list[tuple[int, int]] = []
        self._restore: list[Callable[[], None]] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        from lightning.pytorch.trainer import call

        original = call._call_callback_hooks
        call._call_callback_hooks = self._timed(original)
        self._restore.append(lambda: setattr(call, "_call_callback_hooks", original))
        profiler = trainer.profiler
        trainer.profiler = _TimedProfiler(profiler, self)
        self._restore.append(lambda: setattr(trainer, "profiler", profiler))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.counting:
                return method(*args, **kwargs)
            started = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                self.in_calls_ns += time.perf_counter_ns() - started

        return timed

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1
        if self.batches in (self.first, self.last):
            self.schedstat.append(thread_schedstat_ns())
            self.counting = self.batches == self.first

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        while self._restore:
            self._restore.pop()()

    def per_batch_us(self) -> dict[str, float] | None:
        """µs per batch in hooks and profiler calls, and waiting for a core; None if the window was not reached."""
        if len(self.schedstat) != 2:
            return None
        batches = self.last - self.first
        (ran, waited), (ran_after, waited_after) = self.schedstat
        return {
            "in_calls_us": self.in_calls_ns / batches / 1000,
            "on_cpu_us": (ran_after - ran) / batches / 1000,
            "waited_us": (waited_after - waited) / batches / 1000,
        }


class _TimedProfiler:
    """The trainer's profiler, its `start` and `stop` (Lightning calls them around every fetch) timed."""

    def __init__(self, wrapped: Any, parts: StepParts) -> None:
        self.wrapped = wrapped
        self.start = parts._timed(wrapped.start)
        self.stop = parts._timed(wrapped.stop)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)


def thread_schedstat_ns() -> tuple[int, int]:
    """The calling thread's time on a CPU and waiting on a run queue, in ns (Linux); zeros elsewhere."""
    try:
        ran, waited, _ = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0, 0
    return int(ran), int(waited)


def share_pct(parts: dict[str, float], step_ms: float) -> float:
    """A fit's hook, profiler and run-queue time per batch, as a share of its own median step."""
    return (parts["in_calls_us"] + parts["waited_us"]) / (step_ms * 10)


def added_pct(rows: list[dict[str, Any]], bare: list[dict[str, Any]]) -> float | None:
    """The median share of `rows` less the median share of the bare fits: what the profiler added to a step."""
    shares = [row["parts_pct"] for row in rows if row.get("parts_pct") is not None]
    bare_shares = [row["parts_pct"] for row in bare if row.get("parts_pct") is not None]
    if not shares or not bare_shares:
        return None
    return statistics.median(shares) - statistics.median(bare_shares)
