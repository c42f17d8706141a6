"""NVIDIA GPUs of this job through NVML (the optional `gpu` extra, nvidia-ml-py): MLflow's names, plus energy.

Energy comes from `nvmlDeviceGetTotalEnergyConsumption`, millijoules since the driver loaded (Volta and
newer), read at each system sample on the sampler's thread: no thread of its own, no device sync. The
counter belongs to the whole GPU: on a GPU shared with other jobs it includes their work. MIG instances and
older GPUs do not have it (NVML answers NotSupported); `energy_unavailable` then says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from anemoi_profiler.measure.resource import LOGGER, GpuResource, gpu_metric
from anemoi_profiler.measure.visible_devices import visible_gpu_uuids
from anemoi_profiler.report_sections import MB

try:
    import pynvml
except ImportError:  # the optional `gpu` extra (nvidia-ml-py) is not installed
    pynvml = None

NO_ENERGY_COUNTER = "NVML has no energy counter for it (a MIG instance, or a GPU older than Volta)"


class NvidiaGpuResource(GpuResource):
    """Utilisation, memory, power, temperature and energy of the NVIDIA GPUs this job uses."""

    def __init__(self, handles: dict[int, Any]) -> None:
        super().__init__(handles)
        self.errors = (pynvml.NVMLError,)

    @classmethod
    def for_this_job(
        cls, cuda_visible_devices: str | None, gpu_ordinals: Iterable[int] | None = None
    ) -> NvidiaGpuResource | None:
        """The GPUs this job sees, or None (with one info line saying why) when NVML can't read any."""
        if pynvml is None:
            LOGGER.info("No GPU system metrics: nvidia-ml-py is not installed (pip install nvidia-ml-py).")
            return None
        try:
            pynvml.nvmlInit()
            nvml_uuids = [
                pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
                for index in range(pynvml.nvmlDeviceGetCount())
            ]
            uuids = visible_gpu_uuids(cuda_visible_devices, nvml_uuids, gpu_ordinals)
            handles = {ordinal: pynvml.nvmlDeviceGetHandleByUUID(uuid) for ordinal, uuid in uuids.items()}
        except pynvml.NVMLError as error:
            LOGGER.info("No GPU system metrics: NVML cannot read the GPUs (%s).", error)
            return None
        if not handles:
            LOGGER.info(
                "No GPU system metrics: none selected (CUDA_VISIBLE_DEVICES=%r, gpu_ordinals=%r, %d GPUs).",
                cuda_visible_devices,
                gpu_ordinals,
                len(nvml_uuids),
            )
            return None
        return cls(handles)

    def _sample_gpu(self, ordinal: int, handle: Any) -> dict[str, float]:
        values: dict[str, float] = {}
        utilization = self._query(ordinal, "utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
        if utilization is not None:
            values[gpu_metric(ordinal, "utilization_percentage")] = float(utilization.gpu)
        memory = self._query(ordinal, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            values[gpu_metric(ordinal, "memory_usage_megabytes")] = memory.used / MB
            values[gpu_metric(ordinal, "memory_usage_percentage")] = 100.0 * memory.used / memory.total
        power_mw = self._query(ordinal, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
        if power_mw is not None:
            values[gpu_metric(ordinal, "power_usage_watts")] = power_mw / 1000.0
            limit_mw = self._query(ordinal, "power limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            if limit_mw:
                values[gpu_metric(ordinal, "power_usage_percentage")] = 100.0 * power_mw / limit_mw
        sensor = pynvml.NVML_TEMPERATURE_GPU
        temperature = self._query(ordinal, "temperature", pynvml.nvmlDeviceGetTemperature, handle, sensor)
        if temperature is not None:
            values[gpu_metric(ordinal, "temperature_celsius")] = float(temperature)
        joules = self._energy_joules(ordinal, handle)
        if joules is not None:
            values[gpu_metric(ordinal, "energy_joules")] = joules
        return values

    def _energy_joules(self, ordinal: int, handle: Any) -> float | None:
        """Joules since the previous sample; None at the first and where the GPU has no counter."""
        if ordinal in self.energy_unavailable:
            return None
        try:
            total_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError_NotSupported:
            self.energy_unavailable[ordinal] = NO_ENERGY_COUNTER  # asked once: it will not appear later
            return None
        except pynvml.NVMLError as error:  # a passing refusal: retried at the next sample, from a new base
            self._report_once(ordinal, "energy", error)
            self.energy.forget(ordinal)
            return None
        return self.energy.joules_since_last(ordinal, total_mj / 1000.0)
