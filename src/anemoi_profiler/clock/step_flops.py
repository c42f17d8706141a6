"""The FLOPs of one real training step, counted once, on the first: what MFU needs when no figure is configured.

The stage clock runs it at the first training batch: Lightning's `run_training_batch` block alone where the loop
timer sees it (no callback's hooks, such as the model summary's forward pass), else the whole batch. Meanwhile
the step runs eagerly: under torch's FLOP counter a compiled model would never compile (see `eager`); it
compiles on the next step instead, with the same graphs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Hashable, Iterator
from typing import Any

from anemoi_profiler.clock.eager import can_run_eagerly, eager, is_compiled
from anemoi_profiler.clock.loop_timer import LoopTimer
from anemoi_profiler.logs import get_logger
from anemoi_profiler.trainer import lightning_private

log = get_logger(__name__)


class FirstStepFlops:
    def __init__(self, pl_module: Any, ranks_per_replica: int) -> None:
        """`pl_module` is read at the first step: `configure_model` may shard it after the clock is made."""
        self._pl_module = pl_module
        self._ranks_per_replica = ranks_per_replica
        self._counter: StepFlopCounter | None = None
        self._said: set[Hashable] = set()

    def step_started(self, timer: LoopTimer | None) -> None:
        try:
            if is_compiled(self._pl_module) and not can_run_eagerly():
                self._warn(
                    "FLOPs not counted: on torch < 2.6 counting a compiled model's step would stop it compiling; "
                    "set throughput.flops_per_sample for MFU"
                )
                return
            self._counter = StepFlopCounter()
            if timer is not None:
                timer.around_next(lightning_private.TRAINING_STEP, self._counter.counting)
            else:
                self._counter.start()
        except Exception as error:  # MFU is left out; the rates are still measured
            self._failed(error)

    def step_ended(self, timer: LoopTimer | None, samples: int) -> float:
        """This rank's FLOPs per sample of the step, 0 when they could not be counted."""
        counter, self._counter = self._counter, None
        if counter is None:
            return 0.0
        try:
            if timer is not None and timer.cancel_around():
                lightning_private.missing(
                    f"profiler action {lightning_private.TRAINING_STEP!r}", "FLOPs and MFU are not assessed"
                )
            total = counter.stop()
            return total / samples / self._global_shape_share() if samples and total else 0.0
        except Exception as error:
            self._failed(error)
            return 0.0

    def close(self) -> None:
        """Leave neither the counter nor eager mode on (the first step failed)."""
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.stop()

    def _global_shape_share(self) -> int:
        """Torch's FLOP counter sees DTensor operations with their global shapes: under tensor parallelism each
        rank would be credited the whole replica's FLOPs, so each gets its share. FSDP2 alone gathers whole
        parameters before its operators and anemoi's model groups shard plain tensors: their counts are local."""
        if self._ranks_per_replica == 1 or self._pl_module is None:
            return 1
        from torch.distributed.tensor import DTensor

        dtensors = any(isinstance(p, DTensor) for p in self._pl_module.parameters())
        return self._ranks_per_replica if dtensors else 1

    def _failed(self, error: Exception) -> None:
        self._counter = None
        self._warn(f"could not count FLOPs ({type(error).__name__}: {error}); MFU not reported")

    def _warn(self, message: str) -> None:
        log.warning_once(self._said, "flops", "%s", message)


class StepFlopCounter:
    """Torch's FLOP counter over one training step, which runs eagerly meanwhile."""

    def __init__(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        self._counter = FlopCounterMode(display=False)
        self._active: contextlib.ExitStack | None = None
        self._done = False
        self._total = 0

    def start(self) -> None:
        if self._done or self._active is not None:
            return
        self._active = contextlib.ExitStack()
        self._active.enter_context(eager())
        self._active.enter_context(warnings.catch_warnings())
        # A compiled submodule warns that the counter's module hooks fire twice: they do not change the count.
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        self._active.enter_context(self._counter)

    def stop(self) -> int:
        """The FLOPs counted (0 when counting never started); a later `start` does nothing."""
        self._done = True
        self._finish()
        return self._total

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.start()
        try:
            yield
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._active is not None:
            active, self._active = self._active, None
            active.close()
            self._total = int(self._counter.get_total_flops())
