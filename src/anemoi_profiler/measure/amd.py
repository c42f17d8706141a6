"""AMD GPUs of this job through amdsmi, under the same MLflow names as NVIDIA's, plus energy.

Why amdsmi and not pyrsmi (which MLflow's ROCm monitor uses): amdsmi is the library ROCm ships and develops
(rocm-smi, which pyrsmi wraps, is deprecated in its favour) and what torch itself uses on ROCm; it gives the
power cap, the energy counter and, from ROCm 6.4, each GPU's HIP id, so `gpu_<i>` is the device torch calls
`cuda:i`. Its Python package must match the installed ROCm (install it from `$ROCM_PATH/share/amd_smi`, or
the PyPI release of the same version), and its keys changed across 6.x; each reading below takes the names
of every release since 6.0 and leaves out what a release does not report ("N/A").

Each MI250X GCD is its own torch device and is reported as its own `gpu_<i>`, but the package's power (and
energy counter) is reported on one GCD of the two; the other answers "N/A" and gets no power or energy
values, so the package is counted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from anemoi_profiler.measure.resource import LOGGER, GpuResource, gpu_metric
from anemoi_profiler.measure.visible_devices import rocm_visible_gpu_uuids

MIB = 2**20  # amdsmi reports VRAM in MiB
MICRO = 1e-6
POWER_KEYS = ("socket_power", "current_socket_power", "average_socket_power")
"""`amdsmi_get_power_info` names, newest first: 7.x has all three, MI300 reports no average, 6.0 only the average."""


def import_amdsmi() -> Any:
    """amdsmi, imported when first needed: its import loads ROCm's libamd_smi.so, which only ROCm nodes have."""
    import amdsmi

    return amdsmi


class AmdGpuResource(GpuResource):
    """Utilisation, memory, power, temperature and energy of the AMD GPUs (or MI250X GCDs) this job uses."""

    def __init__(self, smi: Any, handles: dict[int, Any]) -> None:
        super().__init__(handles)
        self.smi = smi
        self.errors = (smi.AmdSmiException,)
        self.power_elsewhere: set[int] = set()
        """GCDs whose package's power and energy are reported on the other GCD (MI250X)."""

    @classmethod
    def for_this_job(
        cls, environ: Mapping[str, str], gpu_ordinals: Iterable[int] | None = None
    ) -> AmdGpuResource | None:
        """The GPUs torch on ROCm sees, or None (with one info line saying why) when amdsmi can't read any."""
        try:
            smi = import_amdsmi()
        except (ImportError, OSError) as error:
            LOGGER.info(
                "No GPU system metrics: amdsmi cannot be imported (%s); install the amdsmi package of your "
                "ROCm (pip install $ROCM_PATH/share/amd_smi).",
                error,
            )
            return None
        try:
            smi.amdsmi_init()
            ordered = _in_hip_order(smi, smi.amdsmi_get_processor_handles())
            uuids = [_rocm_uuid(smi, handle, index) for index, handle in enumerate(ordered)]
            selected = rocm_visible_gpu_uuids(environ, uuids, gpu_ordinals)
        except smi.AmdSmiException as error:
            LOGGER.info("No GPU system metrics: amdsmi cannot read the GPUs (%s).", error)
            return None
        by_uuid = {uuid.lower(): handle for uuid, handle in zip(uuids, ordered, strict=True)}
        handles = {ordinal: by_uuid[uuid] for ordinal, uuid in selected.items()}
        if not handles:
            LOGGER.info(
                "No GPU system metrics: none selected (%d AMD GPUs, gpu_ordinals=%r).", len(uuids), gpu_ordinals
            )
            return None
        return cls(smi, handles)

    def _sample_gpu(self, ordinal: int, handle: Any) -> dict[str, float]:
        smi, values = self.smi, {}
        activity = self._query(ordinal, "utilization", smi.amdsmi_get_gpu_activity, handle) or {}
        if (busy := _number(activity.get("gfx_activity"))) is not None:
            values[gpu_metric(ordinal, "utilization_percentage")] = busy
        vram = self._query(ordinal, "memory", smi.amdsmi_get_gpu_vram_usage, handle) or {}
        used, total = _number(vram.get("vram_used")), _number(vram.get("vram_total"))
        if used is not None and total:
            values[gpu_metric(ordinal, "memory_usage_megabytes")] = used * MIB / 1e6
            values[gpu_metric(ordinal, "memory_usage_percentage")] = 100.0 * used / total
        temperature = self._query(
            ordinal, "temperature", smi.amdsmi_get_temp_metric, handle,
            smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT,
        )  # fmt: skip
        if (celsius := _number(temperature)) is not None:
            values[gpu_metric(ordinal, "temperature_celsius")] = celsius
        power = self._query(ordinal, "power", smi.amdsmi_get_power_info, handle)
        watts = next((w for key in POWER_KEYS if (w := _number((power or {}).get(key))) and w > 0), None)
        if watts is None:
            if power is not None:  # answered, but "N/A": the other GCD of an MI250X carries the package
                self.power_elsewhere.add(ordinal)
            return values
        values[gpu_metric(ordinal, "power_usage_watts")] = watts
        cap = self._query(ordinal, "power limit", smi.amdsmi_get_power_cap_info, handle) or {}
        if cap_watts := (_number(cap.get("power_cap")) or 0) * MICRO:  # microwatts on Linux
            values[gpu_metric(ordinal, "power_usage_percentage")] = 100.0 * watts / cap_watts
        joules = self._energy_joules(ordinal, handle)
        if joules is not None:
            values[gpu_metric(ordinal, "energy_joules")] = joules
        return values

    def _energy_joules(self, ordinal: int, handle: Any) -> float | None:
        """Joules since the previous sample: the accumulator times its resolution (microjoules per count)."""
        counter = self._query(ordinal, "energy", self.smi.amdsmi_get_energy_count, handle)
        # ROCm 6.0 and 6.1 call the accumulator "power"; later releases "energy_accumulator"
        count = _number((counter or {}).get("energy_accumulator", (counter or {}).get("power")))
        resolution = _number((counter or {}).get("counter_resolution"))
        if count is None or not resolution:
            if counter is not None:
                self.energy_unavailable[ordinal] = "amdsmi reports no energy counter for it"
            self.energy.forget(ordinal)
            return None
        return self.energy.joules_since_last(ordinal, count * resolution * MICRO)


def _in_hip_order(smi: Any, handles: Sequence[Any]) -> list[Any]:
    """amdsmi's handles in HIP's order, by the HIP id amdsmi reports from ROCm 6.4 on.

    Before 6.4 there is no HIP id: amdsmi's own order is taken, which is HIP's on the usual nodes (both
    follow the GPUs' KFD nodes); torch makes the same assumption and warns about it.
    """
    try:
        hip_ids = [smi.amdsmi_get_gpu_enumeration_info(handle).get("hip_id") for handle in handles]
    except (AttributeError, smi.AmdSmiException):
        hip_ids = []
    if len(hip_ids) != len(handles) or not all(isinstance(hip_id, int) for hip_id in hip_ids):
        if len(handles) > 1:
            LOGGER.info("amdsmi reports no HIP ids (ROCm < 6.4): taking amdsmi's GPU order as HIP's.")
        return list(handles)
    return [handle for _, handle in sorted(zip(hip_ids, handles, strict=True), key=lambda pair: pair[0])]


def _rocm_uuid(smi: Any, handle: Any, index: int) -> str:
    """`GPU-<asic serial>`, the UUID form ROCR_/HIP_VISIBLE_DEVICES take (as torch reads them)."""
    try:
        serial = str(smi.amdsmi_get_gpu_asic_info(handle).get("asic_serial", ""))
    except smi.AmdSmiException:
        serial = ""
    serial = serial.removeprefix("0x").removeprefix("0X")
    return f"GPU-{serial.lower()}" if serial and serial != "N/A" else f"amd-gpu-{index}"  # index entries still work


def _number(value: Any) -> float | None:
    """A reading as a float; None for amdsmi's "N/A" and anything else that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
