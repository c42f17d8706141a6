"""Who everyone waits for: each rank's wait for its step's last gradient all-reduce, timed by a DDP comm hook.

The all-reduce makes every rank's wall time per step equal, so step times cannot find a straggler. The wait
can: from the moment a rank has produced its last gradient bucket to the moment that bucket's all-reduce
completes, the straggler waits only for the transfer, every other rank also for the straggler. The hook does
the same all-reduce as DDP without a hook (torch's reference `allreduce_hook`), or wraps the user's
`ddp_comm_hook` (compression, PowerSGD) before Lightning registers it, so the training's numerics do not
change. Micro-batches under `no_sync` (gradient accumulation) fire no hook: the wait is per optimizer step.

Host clocks on CPU (gloo completes the future when the all-reduce is done). On CUDA the future completes when
the work is queued, so the two moments are CUDA events, read when the GPU has passed them (no device sync).
Where no hook can time the wait (FSDP's reduce-scatter, tensor or model-parallel collectives inside forward,
a hook the profiler cannot wrap), `not_assessed` says why and nothing is measured.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from anemoi_profiler.logs import get_logger
from anemoi_profiler.trainer import lightning_private, trainer_info

log = get_logger(__name__)

Mark = float | torch.cuda.Event


class GradientSyncTimer:
    def __init__(self, device: torch.device, data_parallel_size: int, enabled: bool) -> None:
        self._cuda = device.type == "cuda"
        self._data_parallel_size = data_parallel_size
        self.not_assessed: str | None = None if enabled else "off (distributed.straggler=false)"
        self._wrapped_user_hook = False
        self._pending: list[tuple[Mark, Mark]] = []
        self._lock = threading.Lock()  # the hook's future completes on a communication thread
        self._last_buckets_launched = 0
        self._last_buckets_completed = 0

    # ---- registration ----
    def wrap_user_hook(self, trainer: Any) -> None:
        """Before the strategy's setup: put the timer around the user's `ddp_comm_hook`, which Lightning then
        registers (on CUDA only; on CPU it ignores the user's hook, and `register` puts ours)."""
        strategy: Any = getattr(trainer, "strategy", None)
        user_hook = lightning_private.ddp_comm_hook(strategy)
        if self.not_assessed or user_hook is None or trainer_info.root_device(trainer).type != "cuda":
            return
        lightning_private.replace_ddp_comm_hook(strategy, functools.wraps(user_hook)(self._around(user_hook)))
        self._wrapped_user_hook = True

    def register(self, trainer: Any) -> None:
        """After the strategy wrapped the model: time the all-reduce of the DDP model, or say why not."""
        if self.not_assessed:
            return
        model = getattr(getattr(trainer, "strategy", None), "model", None)
        world_size = trainer_info.world_size(trainer)
        strategy = trainer_info.strategy_name(trainer)
        if self._data_parallel_size < world_size:
            self._off(
                f"the {world_size // self._data_parallel_size} ranks of each replica wait for each other inside "
                "their forward and backward collectives (tensor parallel, model groups), which no hook times"
            )
        elif not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            sharded = trainer_info.sharding_strategy(trainer)
            how = "no DDP gradient all-reduce"
            if sharded:
                owner = "DeepSpeed" if "DeepSpeed" in sharded else "FSDP"
                how = f"{owner}'s reduce-scatter, which the profiler does not time yet"
            self._off(f"{strategy} reduces gradients with {how}")
        elif not self._wrapped_user_hook:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            try:
                model.register_comm_hook(model.process_group, self._around(allreduce_hook))
            except Exception as error:  # the user registered a hook of their own on the model, say
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                self._off(f"DDP did not take the profiler's communication hook ({reason})")

    def _off(self, reason: str) -> None:
        self.not_assessed = reason
        log.info("collective wait not assessed: %s", reason)

    # ---- the hook ----
    def _around(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """`inner`, timed for the last bucket. DDP checks a hook's annotations against its own classes, so the
        hook has none (this module's annotations are strings)."""

        def timed(state, bucket):
            if not bucket.is_last():
                return inner(state, bucket)
            ready = self._mark()
            self._last_buckets_launched += 1
            return inner(state, bucket).then(functools.partial(self._completed, ready))

        return timed

    def _completed(self, ready: Mark, future: Any) -> Any:
        end = self._mark()
        self._last_buckets_completed += 1
        with self._lock:
            self._pending.append((ready, end))
        return future.value()

    def _mark(self) -> Mark:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # ---- reading ----
    @property
    def all_reduce_pending(self) -> bool:
        """A step's last gradient bucket is in its all-reduce: the stall watchdog's sign of a rank waiting there."""
        return self._last_buckets_launched > self._last_buckets_completed

    def take(self) -> tuple[float, int]:
        """Seconds waited and optimizer steps timed since the last call; on CUDA only the steps the GPU passed."""
        done: list[tuple[Mark, Mark]] = []
        waiting: list[tuple[Mark, Mark]] = []
        with self._lock:
            for pair in self._pending:
                (waiting if isinstance(pair[1], torch.cuda.Event) and not pair[1].query() else done).append(pair)
            self._pending = waiting
        return sum(_seconds(ready, end) for ready, end in done), len(done)


def _seconds(ready: Mark, end: Mark) -> float:
    if isinstance(ready, float) and isinstance(end, float):
        return end - ready
    assert isinstance(ready, torch.cuda.Event) and isinstance(end, torch.cuda.Event)  # one clock: both or neither
    return ready.elapsed_time(end) / 1000.0
