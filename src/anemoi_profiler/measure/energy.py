"""A node's energy over a run, from the per-interval energy the system resources report.

Each sample brings `gpu_<i>_energy_joules` (NVIDIA, AMD) and `cpu_energy_joules` (RAPL) for the interval
since the previous sample. The tally keeps the whole run's joules per counter and, for the intervals that
lay wholly in the training's steady steps (the stage clock's train meter running at both ends, no validation
and no step left out of the steady figures in between), their joules and seconds: the steady-state power. Over
the headline's steady samples/s (`reports.steady`) it gives the energy per sample: steady power x steady seconds
/ steady samples, the same steady intervals as the headline, though the samples do not start and end at
sampling instants.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import astuple, dataclass

from anemoi_profiler import names
from anemoi_profiler.measure.powercap import why_no_cpu_energy

GPU_ENERGY = re.compile(r"^gpu_\d+_energy_joules$")
CPU_ENERGY = "cpu_energy_joules"
JOULES_PER_KWH = 3.6e6
SHARED_GPU_CAVEAT = "a GPU shared with other jobs counts their energy too"


def is_gpu_energy(name: str) -> bool:
    return bool(GPU_ENERGY.match(name))


class EnergyTally:
    """Joules per energy counter over the run, and joules and seconds over the steady-state intervals."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.steady: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def add(self, values: dict[str, float], seconds: float, steady: bool) -> None:
        """One sample's values (names without any `system/...` prefix) for an interval of `seconds`."""
        for name, joules in values.items():
            if name != CPU_ENERGY and not is_gpu_energy(name):
                continue
            self.total[name] += joules
            if steady and seconds > 0:
                self.steady[name][0] += joules
                self.steady[name][1] += seconds

    def joules(self, gpu: bool) -> float:
        """The whole run's joules of the GPUs (`gpu=True`) or the CPU packages."""
        return sum(joules for name, joules in self.total.items() if is_gpu_energy(name) == gpu)

    def steady_watts(self, gpu: bool) -> float | None:
        """Mean steady-state power summed over the counters; None when one had no steady-state interval."""
        names = [name for name in self.total if is_gpu_energy(name) == gpu]
        if not names or any(self.steady[name][1] <= 0 for name in names):
            return None
        return sum(self.steady[name][0] / self.steady[name][1] for name in names)

    def counters(self, gpu: bool) -> int:
        return sum(1 for name in self.total if is_gpu_energy(name) == gpu)


@dataclass
class EnergyShare:
    """What one rank adds to the job's energy figures, the unit the ranks exchange.

    A rank that samples its node (local rank 0) brings the node's counters and steady-state power; the samples
    per second they are divided by are the job's headline (`figures`).
    """

    nodes: float = 0.0
    gpus: float = 0.0
    gpus_without_counter: float = 0.0
    gpu_counters: float = 0.0
    gpu_joules: float = 0.0
    steady_gpu_watts: float = 0.0
    """The node's GPU power over the sampling intervals that lay wholly in steady steps."""
    no_steady_interval: float = 0.0
    cpu_counters: float = 0.0
    cpu_joules: float = 0.0

    def to_list(self) -> list[float]:
        return [float(value) for value in astuple(self)]

    @classmethod
    def total(cls, ranks: list[list[float]]) -> EnergyShare:
        return cls(*(sum(column) for column in zip(*ranks, strict=True)))

    def figures(
        self, interval_s: float, reasons: list[str], samples_per_sec: float | None
    ) -> tuple[dict[str, float], list[str]]:
        """`summary/energy/...` values and the notes that say what they are, or why one is not available.

        `reasons` say why GPUs of this node have no energy counter (the library's own words); `samples_per_sec` is
        the job's steady headline (`summary/train/samples_per_sec`), None when not measured. Energy per sample is
        the steady power over it: steady power x steady seconds / steady samples, over the headline's intervals.
        """
        summary: dict[str, float] = {}
        notes = []
        if self.gpus and (self.gpus_without_counter or not self.gpu_counters):
            why = (
                f"{self.gpus_without_counter:g} of {self.gpus:g} GPUs have no energy counter: "
                + ("; ".join(reasons) or "on another node")
                if self.gpus_without_counter
                else "no GPU of this job reports energy (an MI250X reports it on one GCD of each package)"
            )
            notes.append(f"GPU energy: not available ({why}).")
        elif self.gpu_counters:
            summary[names.SUMMARY_GPU_KWH] = self.gpu_joules / JOULES_PER_KWH
            if not samples_per_sec:
                notes.append(
                    "Energy per sample: not available (no steady samples/s: ThroughputCallback measures them)."
                )
            elif self.no_steady_interval:
                notes.append(
                    "Energy per sample: not available (no system sample interval lay wholly in the training steady "
                    f"state; they are {interval_s:g} s apart: lower system.interval_s)."
                )
            else:
                summary[names.SUMMARY_JOULES_PER_SAMPLE] = self.steady_gpu_watts / samples_per_sec
            notes.append(
                f"GPU energy of {self.gpus:g} GPU(s) on {self.nodes:g} node(s) from their counters, over the run; per "
                "sample: GPU power over the steady steps ÷ the steady samples/s (the headline's steady intervals: "
                f"steady power × steady seconds ÷ steady samples); {SHARED_GPU_CAVEAT}."
            )
        if self.nodes and self.cpu_counters == self.nodes:
            summary[names.SUMMARY_CPU_KWH] = self.cpu_joules / JOULES_PER_KWH
        elif self.nodes:
            notes.append(f"CPU package energy: not available ({why_no_cpu_energy()}).")
        return summary, notes
