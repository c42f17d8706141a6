"""Fake GPU libraries for the tests: NVML (`pynvml`) and AMD's `amdsmi`, with the calls and error types the
profiler uses, answering the way the real libraries do (units, "N/A", NotSupported). Their energy counters
integrate a power that a test sets, over real time, so energy figures can be checked against known watts."""

from __future__ import annotations

import threading
import time
import types
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


@dataclass
class FakeGpu:
    """One device: memory in bytes, power in watts (None: not reported), energy integrated from `watts`."""

    uuid: str
    watts: float | None = 250.0
    limit_watts: float = 700.0
    used_bytes: int = 30 * 10**9
    total_bytes: int = 141 * 10**9
    utilization: int = 87
    celsius: int = 54
    energy_supported: bool = True
    serial: str = ""
    hip_id: int | None = None
    integrate: bool = True
    """False: the energy counter moves only by `add_joules`, whatever the power."""
    _joules: float = 0.0
    _since: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def joules(self) -> float:
        """Energy since 'driver load': the power set so far, integrated over real time."""
        with self._lock:
            now = time.monotonic()
            if self.integrate:
                self._joules += (self.watts or 0.0) * (now - self._since)
            self._since = now
            return self._joules

    def set_watts(self, watts: float) -> None:
        self.joules()  # what was drawn at the old power is counted first
        self.watts = watts

    def add_joules(self, joules: float) -> None:
        """Move the counter by a known amount (with `watts=0` it moves by nothing else)."""
        with self._lock:
            self._joules += joules

    def reset_counter(self) -> None:
        """As a driver reload does: the counter starts again from zero."""
        with self._lock:
            self._joules = 0.0


# ---- NVML ----


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 - pynvml's name
    pass


def fake_nvml(gpus: list[FakeGpu]) -> types.SimpleNamespace:
    """A `pynvml` module for `gpus` (in NVML index order)."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}

    def power_mw(gpu: FakeGpu) -> int:
        if gpu.watts is None:
            raise NVMLError_NotSupported("Not Supported")
        return int(gpu.watts * 1000)

    def energy_mj(gpu: FakeGpu) -> int:
        if not gpu.energy_supported:
            raise NVMLError_NotSupported("Not Supported")
        return int(gpu.joules() * 1000)

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotSupported=NVMLError_NotSupported,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: gpus[index],
        nvmlDeviceGetUUID=lambda gpu: gpu.uuid,
        nvmlDeviceGetHandleByUUID=lambda uuid: by_uuid[uuid],
        nvmlDeviceGetUtilizationRates=lambda gpu: types.SimpleNamespace(gpu=gpu.utilization, memory=10),
        nvmlDeviceGetMemoryInfo=lambda gpu: types.SimpleNamespace(used=gpu.used_bytes, total=gpu.total_bytes),
        nvmlDeviceGetPowerUsage=power_mw,
        nvmlDeviceGetEnforcedPowerLimit=lambda gpu: int(gpu.limit_watts * 1000),
        nvmlDeviceGetTemperature=lambda gpu, sensor: gpu.celsius,
        nvmlDeviceGetTotalEnergyConsumption=energy_mj,
    )


# ---- amdsmi ----


class AmdSmiException(Exception):  # noqa: N818 - amdsmi's name
    pass


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


@dataclass
class AmdSmiRelease:
    """What differs between amdsmi releases, as far as the profiler reads it."""

    energy_key: str = "energy_accumulator"  # ROCm 6.0 and 6.1: "power"
    has_enumeration_info: bool = True  # ROCm >= 6.4 reports hip_id
    power_keys: tuple[str, ...] = ("socket_power", "current_socket_power", "average_socket_power")


RESOLUTION_UJ = 15.3  # microjoules per count, as MI250X reports


def fake_amdsmi(gpus: list[FakeGpu], release: AmdSmiRelease | None = None) -> types.ModuleType:
    """An `amdsmi` module whose processor handles are `gpus`, in amdsmi's own order."""
    release = release or AmdSmiRelease()
    module = types.ModuleType("amdsmi")

    def power_info(gpu: FakeGpu) -> dict[str, Any]:
        value: Any = "N/A" if gpu.watts is None else int(gpu.watts)
        info = dict.fromkeys(release.power_keys, value)
        info.update(gfx_voltage="N/A", soc_voltage="N/A", mem_voltage="N/A", power_limit=int(gpu.limit_watts))
        return info

    def energy_count(gpu: FakeGpu) -> dict[str, Any]:
        if not gpu.energy_supported:
            raise AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")
        count = int(gpu.joules() * 1e6 / RESOLUTION_UJ)
        return {release.energy_key: count, "counter_resolution": RESOLUTION_UJ, "timestamp": time.time_ns()}

    def enumeration_info(gpu: FakeGpu) -> dict[str, Any]:
        return {"drm_render": 128, "drm_card": 0, "hsa_id": 1, "hip_id": gpu.hip_id, "hip_uuid": ""}

    module.AmdSmiException = AmdSmiException
    module.AmdSmiTemperatureType = AmdSmiTemperatureType
    module.AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    module.amdsmi_init = lambda *flags: None
    module.amdsmi_get_processor_handles = lambda: list(gpus)
    module.amdsmi_get_gpu_asic_info = lambda gpu: {"market_name": "AMD Instinct MI250X", "asic_serial": gpu.serial}
    module.amdsmi_get_gpu_activity = lambda gpu: {
        "gfx_activity": gpu.utilization,
        "umc_activity": 5,
        "mm_activity": "N/A",
    }
    module.amdsmi_get_gpu_vram_usage = lambda gpu: {
        "vram_total": gpu.total_bytes // 2**20,
        "vram_used": gpu.used_bytes // 2**20,
    }
    module.amdsmi_get_temp_metric = lambda gpu, sensor, metric: gpu.celsius
    module.amdsmi_get_power_info = power_info
    module.amdsmi_get_power_cap_info = lambda gpu: {"power_cap": int(gpu.limit_watts * 1e6), "dpm_cap": 0}
    module.amdsmi_get_energy_count = energy_count
    if release.has_enumeration_info:
        module.amdsmi_get_gpu_enumeration_info = enumeration_info
    return module
