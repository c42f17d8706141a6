"""An independent count of what anemoi trained, with a clock of its own, for check_run.py to hold the profiler to.

Listed in the e2e config's `diagnostics.callbacks` beside the profiler; shares no code with it. Writes `path` (JSON)
when training ends: every training batch's end time, epoch and samples, the validation intervals, and the model's
parameter counts (the LightningModule's and its `model`, the AnemoiModelInterface) as `sum(p.numel())`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pytorch_lightning.callbacks import Callback


class BatchClock(Callback):
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.batches: list[dict[str, Any]] = []
        self.validations: list[tuple[float, float]] = []
        self._validation_start = 0.0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        tensor = next(iter(batch.values())) if isinstance(batch, dict) else batch
        self.batches.append(
            {
                "t": time.perf_counter(),
                "epoch": trainer.current_epoch,
                "step": trainer.global_step,
                "samples": int(tensor.shape[0]),
            }
        )

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.validations.append((self._validation_start, time.perf_counter()))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "batches": self.batches,
            "validations": self.validations,
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "model_parameters": sum(p.numel() for p in pl_module.model.parameters()),
            "world_size": trainer.world_size,
        }
        self.path.write_text(json.dumps(record))
