"""System metrics (CPU, memory, disk, network, this job's GPUs) under MLflow's `system/...` names.

One sampler per node (local rank 0), in a background thread; each sample is logged at the training
`global_step` current when it was taken, so system and training curves share an axis.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..measure.system_metrics import SystemMetricsSampler
from ..report import ReportSection
from ..run import trainer_info
from .base import ProfilerCallback


class SystemMetricsCallback(ProfilerCallback):
    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        self.sampler: SystemMetricsSampler | None = None
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        if trainer_info.local_rank(trainer) != 0:
            return
        options = self.config.system
        multi_node = trainer_info.num_nodes(trainer) > 1
        device = trainer_info.root_device(trainer)
        gpus = self._job_gpus(trainer, device) if options.gpus and device.type == "cuda" else []
        self.sampler = SystemMetricsSampler(
            publish=self._publish,
            step_fn=lambda: trainer_info.global_step(trainer),
            interval_s=options.interval_s,
            node_id=f"node_{trainer_info.node_rank(trainer)}" if multi_node else None,
            gpu_ordinals=gpus,
            disk_path=options.disk_path,
        )
        self.sampler.start()

    @staticmethod
    def _job_gpus(trainer: Any, device: Any) -> list[int]:
        """CUDA ordinals this node's ranks use (Lightning's parallel devices), else this rank's device."""
        devices = getattr(getattr(trainer, "strategy", None), "parallel_devices", None) or [device]
        return sorted({d.index for d in devices if getattr(d, "type", None) == "cuda" and d.index is not None})

    def _publish(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            total = self.sums[key]
            total[0] += value
            total[1] += 1
        self.session.log_metrics(metrics, step)

    def stop_background_work(self) -> None:
        if getattr(self, "sampler", None) is not None:
            self.sampler.stop()

    def summarize(self, trainer: Any) -> tuple[ReportSection | None, dict[str, float]]:
        self.stop_background_work()
        means = {key: total / count for key, (total, count) in sorted(self.sums.items()) if count}
        if not means:
            return None, {}
        values = {key.removeprefix("system/"): (value, "") for key, value in means.items()}
        samples = max(int(count) for _, count in self.sums.values())
        note = f"Means over {samples} samples, every {self.config.system.interval_s:g} s."
        return ReportSection.key_values("System (mean)", values, note), {}
