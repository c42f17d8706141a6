"""System metrics (CPU, memory, disk, network, this job's GPUs, energy) under MLflow's `system/...` names.

One sampler per node (local rank 0), in a background thread; each sample is logged at the training
`global_step` current when it was taken, so system and training curves share an axis. NVIDIA GPUs are read
through NVML, AMD GPUs (torch on ROCm) through amdsmi. Rank 0 logs its node under MLflow's own names and the
cluster's view of every node; the per-node, per-GPU detail goes to the run folder (`cluster.system_nodes`).

Energy per sample: each sample's per-interval energy goes into a tally that keeps apart the intervals lying
wholly in the training's steady steps (read from the session's stage clock by the sampler thread: two
attributes, no sync). At the end every rank contributes to one exchange, so the figures are the job's: the
steady-state GPU power of every node over the headline's steady samples/s (`reports.steady`), one definition of
the steady steps for both.
"""

from __future__ import annotations

import socket
import time
from collections import defaultdict
from typing import Any

import torch

from anemoi_profiler import names
from anemoi_profiler.callbacks.base import ProfilerCallback, guarded
from anemoi_profiler.callbacks.throughput import ThroughputCallback
from anemoi_profiler.cluster.system_nodes import NodeRecorder, SystemExchange
from anemoi_profiler.measure.energy import EnergyShare, EnergyTally
from anemoi_profiler.measure.resource import GpuResource
from anemoi_profiler.measure.system_metrics import SystemMetricsSampler
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.reports.cluster_view import nodes_section
from anemoi_profiler.run_files.system_tables import NodeSample
from anemoi_profiler.trainer import trainer_info


class SystemMetricsCallback(ProfilerCallback):
    """Samples CPU, memory, disk, network and GPUs every `system.interval_s` into MLflow's `system/...` metrics,
    one sampler thread per node, and reports energy per sample at the end.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
    """

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        self.sampler: SystemMetricsSampler | None = None
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.energy = EnergyTally()
        self._validations = 0
        # time, train meter running, validations, steps left out of the steady figures
        self._last_publish: tuple[float, bool, int, int] | None = None
        options = self.config.system
        self._node, self._host = trainer_info.node_rank(trainer), socket.gethostname()
        session = self.session
        several_nodes = trainer_info.num_nodes(trainer) > 1
        self._recorder: NodeRecorder | None = None
        if session.is_global_zero:
            self._recorder = NodeRecorder(session, options.per_node_series, several_nodes)
        self._exchange: SystemExchange | None = None
        if several_nodes and session.stage_clock is not None:
            self._exchange = SystemExchange(session, options.interval_s, self._recorder)
            session.stage_clock.train_exchanges.append(self._exchange)
        if trainer_info.local_rank(trainer) != 0:
            return
        self.sampler = SystemMetricsSampler(
            publish=self._publish,
            step_fn=lambda: trainer_info.global_step(trainer),
            interval_s=options.interval_s,
            gpu_ordinals=self._job_gpus(trainer) if options.gpus else [],
            disk_path=options.disk_path,
            gpu_vendor="amd" if torch.version.hip else "nvidia",
        )
        self.sampler.start()

    @staticmethod
    def _job_gpus(trainer: Any) -> list[int]:
        """CUDA (or ROCm) ordinals this node's ranks use (Lightning's parallel devices), else this rank's device."""
        device = trainer_info.root_device(trainer)
        devices = getattr(getattr(trainer, "strategy", None), "parallel_devices", None) or [device]
        return sorted({d.index for d in devices if getattr(d, "type", None) == "cuda" and d.index is not None})

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._validations += 1  # a sampling interval with a validation inside is not steady state

    def _publish(self, metrics: dict[str, float], step: int) -> None:
        """On the sampler's thread: keep the means and the energy, and queue the metrics."""
        for key, value in metrics.items():
            total = self.sums[key]
            total[0] += value
            total[1] += 1
        clock = self.session.stage_clock
        now, training = time.monotonic(), clock is not None and clock.meters["train"].running
        left_out = clock.left_out_steps if clock is not None else 0
        if self._last_publish is not None:
            then, trained_then, validations_then, left_out_then = self._last_publish
            steady = training and trained_then and validations_then == self._validations and left_out_then == left_out
            names = {key.rsplit("/", 1)[-1]: value for key, value in metrics.items()}
            self.energy.add(names, now - then, steady)
        self._last_publish = (now, training, self._validations, left_out)
        if self.session.is_global_zero:
            self.session.log_metrics(metrics, step)  # MLflow's own names: its System metrics tab
        sample = NodeSample.of_metrics(self._node, step, time.time(), metrics)
        sample.host = self._host
        if self._exchange is not None:
            self._exchange.add(sample)  # to rank 0 at the next exchange
        elif self._recorder is not None:
            self._recorder.record([sample], step)

    def stop_background_work(self) -> None:
        sampler = getattr(self, "sampler", None)
        if sampler is not None:
            sampler.stop()

    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        self.stop_background_work()
        if self._exchange is not None and not self.session.failed:
            self._exchange.finish(trainer_info.global_step(trainer))  # collectives: every rank, every time
        summary, energy_notes = self._job_energy(trainer)  # a collective: every rank, every time
        means = {key: total / count for key, (total, count) in sorted(self.sums.items()) if count}
        if not self.session.is_global_zero or not (means or summary):
            return [], {}
        across_nodes = nodes_section(self._recorder.means.means()) if self._recorder is not None else None
        values = {key.removeprefix(names.SYSTEM): (value, "") for key, value in means.items() if "energy" not in key}
        units = {"kwh": "kWh", "per_sample": "J"}
        for key, value in summary.items():
            name = key.removeprefix(names.SUMMARY)
            values[name] = (value, next(unit for end, unit in units.items() if name.endswith(end)))
        samples = max((int(count) for _, count in self.sums.values()), default=0)
        whose = " of rank 0's node" if self._exchange is not None else ""
        notes = [f"Means over {samples} samples{whose}, every {self.config.system.interval_s:g} s.", *energy_notes]
        sections = [ReportSection.key_values("System", values, " ".join(notes))]
        return sections + ([across_nodes] if across_nodes is not None else []), summary

    # ---- energy of the whole job ----
    def _job_energy(self, trainer: Any) -> tuple[dict[str, float], list[str]]:
        """`summary/energy/...` values and notes, from one exchange of every rank's share."""
        exchange = self.session.exchange
        if self.session.failed and exchange.world_size > 1:
            return {}, []  # the other ranks may never reach this exchange
        ranks = exchange.gather(self._energy_share().to_list())
        if ranks is None:
            return {}, ["Energy: not available (the ranks could not exchange their figures)."]
        gpus = self._gpu_resource()
        reasons = sorted(set(gpus.energy_unavailable.values())) if gpus else []
        rate = self._steady_samples_per_sec(trainer)
        return EnergyShare.total(ranks).figures(self.config.system.interval_s, reasons, rate)

    def _steady_samples_per_sec(self, trainer: Any) -> float | None:
        """The headline's steady samples/s, from the session's throughput callback (rank 0 keeps it)."""
        for callback in getattr(trainer, "callbacks", None) or []:
            if isinstance(callback, ThroughputCallback) and callback.session is self.session and not callback.disabled:
                return callback.steady_rates("train").get(names.TRAIN_SAMPLES_PER_SEC)
        return None

    def _energy_share(self) -> EnergyShare:
        share = EnergyShare()
        if self.sampler is None:
            return share  # not this node's sampler
        gpus = self._gpu_resource()
        steady_watts = self.energy.steady_watts(gpu=True)
        share.nodes = 1.0
        share.gpus = float(len(gpus.handles) if gpus else 0)
        share.gpus_without_counter = float(len(gpus.energy_unavailable) if gpus else 0)
        share.gpu_counters = float(self.energy.counters(gpu=True))
        share.gpu_joules = self.energy.joules(gpu=True)
        share.steady_gpu_watts = steady_watts or 0.0
        share.no_steady_interval = float(share.gpu_counters > 0 and steady_watts is None)
        share.cpu_counters = float(self.energy.counters(gpu=False))
        share.cpu_joules = self.energy.joules(gpu=False)
        return share

    def _gpu_resource(self) -> GpuResource | None:
        resources = self.sampler.resources if self.sampler is not None else []
        return next((resource for resource in resources if isinstance(resource, GpuResource)), None)
