"""Measuring instruments that do not depend on the code under test: a step clock and a hook timer."""

from __future__ import annotations

import cProfile
import functools
import io
import itertools
import os
import pstats
import resource
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.trainer.call import _call_callback_hooks
except ImportError:  # pragma: no cover - only pytorch_lightning installed
    from pytorch_lightning.callbacks import Callback
    from pytorch_lightning.trainer.call import _call_callback_hooks

HOOK_NAMES = tuple(sorted(name for name in dir(Callback) if name.startswith("on_")))


class StepClock(Callback):
    """Reads `perf_counter` at the end of every training batch; the steady state starts after `warmup` batches.

    Put it last in the callback list, so that each interval holds every other callback's work once. On CUDA
    it synchronizes only at the two ends of the measured span (after batch `warmup` and after the last one),
    so the mean step time is the device's, while the clock itself adds nothing per step.
    """

    def __init__(self, warmup: int, total: int, sync_cuda: bool = False) -> None:
        if not 1 <= warmup < total:
            raise ValueError(f"need 1 <= warmup < total, got warmup={warmup}, total={total}")
        self.warmup = warmup
        self.total = total
        self.sync_cuda = sync_cuda
        self.batch_ends: list[float] = []
        self.batch_cpu_ends: list[float] = []  # the training thread's CPU time: steadier than wall on a busy machine
        self.background_cpu_s: dict[str, float] = {}  # per thread, over the measured batches
        self._threads_at_warmup: dict[str, float] = {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        done = len(self.batch_ends) + 1
        if self.sync_cuda and done in (self.warmup, self.total):
            torch.cuda.synchronize()
        self.batch_ends.append(time.perf_counter())
        self.batch_cpu_ends.append(time.thread_time())
        if done == self.warmup:
            self._threads_at_warmup = background_thread_cpu_s()
        elif done == self.total:  # the steady state's share; the callbacks' threads end with the fit
            at_warmup = self._threads_at_warmup
            self.background_cpu_s = {
                name: seconds - at_warmup.get(name, 0.0) for name, seconds in background_thread_cpu_s().items()
            }

    @property
    def measured_batches(self) -> int:
        return max(len(self.batch_ends) - self.warmup, 0)

    @property
    def elapsed_s(self) -> float:
        """Wall time from the end of batch `warmup` to the end of the last batch."""
        if self.measured_batches == 0:
            raise RuntimeError(f"the fit ended after {len(self.batch_ends)} batches, within the warmup")
        return self.batch_ends[-1] - self.batch_ends[self.warmup - 1]

    @property
    def step_ms(self) -> float:
        return self.elapsed_s / self.measured_batches * 1000

    def best_step_ms(self, window: int = 10) -> float:
        """The lowest mean step time over `window` consecutive measured batches: the machine's quiet moments."""
        ends = self.batch_ends[self.warmup - 1 :]
        spans = [later - earlier for earlier, later in zip(ends, ends[window:], strict=False)]
        return min(spans) / window * 1000 if spans else self.step_ms

    def step_cpu_times_ms(self) -> list[float]:
        """The training thread's CPU time in each measured batch (its hooks, the model's host work)."""
        ends = self.batch_cpu_ends[self.warmup - 1 :]
        return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(ends)]

    def step_times_ms(self) -> list[float]:
        """Host time of each measured batch (on CUDA without a sync: the device may lag behind)."""
        ends = self.batch_ends[self.warmup - 1 :]
        return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(ends)]


class HookTimer:
    """Times every hook call into the given callbacks, per training batch, on the training thread.

    It replaces the hook methods of those callback instances with timed wrappers (Lightning looks hooks up
    on the instance). Add `boundary` first in the Trainer's callback list: it closes one batch's account at
    the next batch's start, so a batch's cost is every hook call from its start to the next batch's start.
    Each call is timed twice: wall time (`perf_counter`: what the training waits, preemption and waits for
    the interpreter lock included) and this thread's CPU time (`thread_time`: the work itself).
    """

    def __init__(self, callbacks: Iterable[Any], cprofile: bool = False) -> None:
        self.wall_per_batch: list[float] = []
        self.cpu_per_batch: list[float] = []
        self.wall_per_hook: dict[str, float] = defaultdict(float)
        self._wall = self._cpu = 0.0
        self._in_batches = False
        self.profile = cProfile.Profile() if cprofile else None
        for callback in callbacks:
            for name in HOOK_NAMES:
                hook = getattr(callback, name)
                if callable(hook):  # a callback may take a hook it does not use off its instance
                    setattr(callback, name, self._timed(type(callback).__name__, name, hook))
        self.boundary = _BatchBoundary(self)

    def _timed(self, owner: str, hook: str, method: Callable[..., Any]) -> Callable[..., Any]:
        key = f"{owner}.{hook}"
        wall_clock, cpu_clock, profile = time.perf_counter, time.thread_time, self.profile

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if profile is not None:
                profile.enable()
            wall, cpu = wall_clock(), cpu_clock()
            try:
                return method(*args, **kwargs)
            finally:
                cpu, wall = cpu_clock() - cpu, wall_clock() - wall
                if profile is not None:
                    profile.disable()
                if self._in_batches:
                    self._wall += wall
                    self._cpu += cpu
                    self.wall_per_hook[key] += wall

        return timed

    def close_batch(self) -> None:
        if self._in_batches:
            self.wall_per_batch.append(self._wall)
            self.cpu_per_batch.append(self._cpu)
        self._wall = self._cpu = 0.0
        self._in_batches = True

    def end(self) -> None:
        self.close_batch()
        self._in_batches = False

    def summary(self, warmup: int) -> dict[str, Any]:
        """Per-batch hook time of the batches after `warmup`, in microseconds."""
        wall = [seconds * 1e6 for seconds in self.wall_per_batch[warmup:]]
        cpu = [seconds * 1e6 for seconds in self.cpu_per_batch[warmup:]]
        if not wall:
            return {"batches": 0}
        batches = len(self.wall_per_batch)
        return {
            "batches": len(wall),
            "wall_us": distribution(wall),
            "cpu_us": distribution(cpu),
            "wall_us_per_hook_all_batches": {
                key: seconds * 1e6 / batches for key, seconds in sorted(self.wall_per_hook.items()) if seconds
            },
        }

    def cprofile_top(self, lines: int = 25) -> str:
        if self.profile is None:
            return ""
        text = io.StringIO()
        pstats.Stats(self.profile, stream=text).sort_stats("cumulative").print_stats(lines)
        return text.getvalue()


class HookLoop(Callback):
    """Replays one batch's hook calls in tight loops through Lightning's dispatcher, between bare batches.

    What our callbacks add to every step on the training thread, Lightning's own work to call them
    included, as a share of a bare step measured a moment before. From batch `after_batch` on, our
    callbacks leave `trainer.callbacks` (they are set up and have started); then, `blocks` times: `between`
    real training batches are timed (a bare step, but for our background threads), and a probe runs: a
    block of `per_block` simulated batches (log intervals included, so their work is spread over the
    batches as in training), each batch's hook calls made once with only our callbacks in the list and
    once with none, alternately. The probe's cost is the difference of the two sums; its share is that
    over the bare step just before, so a machine whose speed drifts (up to 2x over seconds on a shared VM)
    scales both alike. After the last probe our callbacks
    come back, for the fit's end. Put it last. The fit needs `after_batch + blocks * between` batches.
    """

    SEQUENCE = (
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_train_batch_end",
    )

    def __init__(self, callbacks: Sequence[Any], after_batch: int, blocks: int, per_block: int, between: int) -> None:
        self.callbacks = list(callbacks)
        self.after_batch = after_batch
        self.blocks = blocks
        self.per_block = per_block
        self.between = between
        self.batches = 0
        self.ours_us: list[float] = []
        self.empty_us: list[float] = []
        self.bare_step_us: list[float] = []
        self._saved: list[Any] = []
        self._since = 0.0

    @property
    def total(self) -> int:
        return self.after_batch + self.blocks * self.between

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        done = self.batches - self.after_batch
        if done < 0 or done % self.between or len(self.ours_us) == self.blocks:
            return
        if done == 0:
            self._saved = list(trainer.callbacks)
            trainer.callbacks[:] = [c for c in self._saved if not any(c is ours for ours in self.callbacks)]
            self._since = time.perf_counter()
            return
        self.bare_step_us.append((time.perf_counter() - self._since) / self.between * 1e6)
        self._probe(trainer, outputs, batch, batch_idx)
        if len(self.ours_us) == self.blocks:
            trainer.callbacks[:] = self._saved
        self._since = time.perf_counter()

    def _probe(self, trainer: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        optimizer = trainer.optimizers[0]
        arguments = {
            "on_train_batch_start": (batch, batch_idx),
            "on_before_backward": (loss,),
            "on_after_backward": (),
            "on_before_optimizer_step": (optimizer,),
            "on_before_zero_grad": (optimizer,),
            "on_train_batch_end": (outputs, batch, batch_idx),
        }
        calls = [(name, arguments[name]) for name in self.SEQUENCE]
        bare = list(trainer.callbacks)
        totals = {"ours": 0.0, "empty": 0.0}
        lists = {"ours": self.callbacks, "empty": []}
        try:
            # Alternating batch by batch (tens of microseconds apart), and which goes first, the two sums see
            # the same machine speed and the same order effects.
            for index in range(self.per_block):
                for kind in ("ours", "empty") if index % 2 == 0 else ("empty", "ours"):
                    trainer.callbacks[:] = lists[kind]
                    started = time.perf_counter()
                    for name, args in calls:
                        _call_callback_hooks(trainer, name, *args)
                    totals[kind] += time.perf_counter() - started
        finally:
            trainer.callbacks[:] = bare
        ours, empty = totals["ours"], totals["empty"]
        self.ours_us.append(ours / self.per_block * 1e6)
        self.empty_us.append(empty / self.per_block * 1e6)

    def summary(self) -> dict[str, Any]:
        """Per probe: cost (with our callbacks less without) and its share of the bare step before it."""
        if not self.ours_us:
            return {"blocks": 0}
        costs = [ours - empty for ours, empty in zip(self.ours_us, self.empty_us, strict=True)]
        shares = [cost / step * 100 for cost, step in zip(costs, self.bare_step_us, strict=True)]
        return {
            "blocks": len(costs),
            "batches_per_block": self.per_block,
            "best_us": min(self.ours_us) - min(self.empty_us),
            "median_us": statistics.median(costs),
            "empty_dispatch_us": min(self.empty_us),
            "bare_step_us": statistics.median(self.bare_step_us),
            "share_of_bare_step_pct": statistics.median(shares),
        }


def background_thread_cpu_s() -> dict[str, float]:
    """CPU seconds of every live thread but the calling one, by thread name (Linux: per-thread CPU clocks)."""
    current = threading.get_ident()
    used = {}
    for thread in threading.enumerate():
        if thread.ident is None or thread.ident == current:
            continue
        try:
            used[thread.name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):
            continue
    return used


class _BatchBoundary(Callback):
    def __init__(self, timer: HookTimer) -> None:
        self.timer = timer

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.timer.close_batch()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.timer.end()


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def distribution(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements (few repetitions: no standard deviation)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def children_cpu_s() -> float | None:
    """CPU seconds this process's live child processes have used (Linux `/proc`); None where it cannot tell."""
    try:
        tasks = list(Path("/proc/self/task").iterdir())
        pids = {pid for task in tasks for pid in (task / "children").read_text().split()}
    except OSError:
        return None
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended a moment ago
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def all_children_cpu_s() -> float:
    """CPU seconds of this process's children: the live ones (`/proc`) and those ended and waited for. A child
    alive at two readings (the MLflow sender kept for the next run) counts what it used between them."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (children_cpu_s() or 0.0) + ended.ru_utime + ended.ru_stime
