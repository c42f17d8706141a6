"""The tiny base of every system resource, and what the GPU resources of each vendor share.

A resource is sampled on the sampler's thread (`system_metrics.SystemMetricsSampler`) and returns MLflow's
metric names without the `system/` prefix. GPU resources also report energy per interval
(`gpu_<i>_energy_joules`) and, where a GPU cannot, why (`energy_unavailable`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from anemoi_profiler.logs import get_logger

LOGGER = get_logger(__name__)


class SystemResource(abc.ABC):
    """One measured resource; subclass it and pass an instance to the sampler to add a resource."""

    name: str = "resource"

    @abc.abstractmethod
    def sample(self) -> dict[str, float]:
        """Current values keyed by metric name, without the ``system/`` prefix."""


def gpu_metric(ordinal: int, name: str) -> str:
    """``gpu_<ordinal>_<name>``: MLflow's per-GPU names, numbered by the ordinal torch gives the device."""
    return f"gpu_{ordinal}_{name}"


class EnergyCounter:
    """Joules per sampling interval from a cumulative counter (one per GPU or CPU package).

    The first reading only sets the base; a counter that went back (a driver reload, a wrap the reader did
    not undo) also only sets a new base, so an interval is never negative or counted twice.
    """

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}

    def joules_since_last(self, key: Any, total_joules: float) -> float | None:
        last = self._last.get(key)
        self._last[key] = total_joules
        if last is None or total_joules < last:
            return None
        return total_joules - last

    def forget(self, key: Any) -> None:
        """A reading was missed: the next one only sets the base, so no interval gets two intervals' energy."""
        self._last.pop(key, None)


class GpuResource(SystemResource):
    """What NVIDIA's and AMD's GPU resources share: handles by ordinal, queries guarded one by one.

    Each query is guarded on its own: a GPU (or MIG slice) that doesn't report power still reports
    utilisation and memory. A query that fails is logged once per GPU and retried at the next sample.
    `energy_unavailable[ordinal]` says why a GPU of this job has no energy counter.
    """

    name = "gpu"
    errors: tuple[type[BaseException], ...] = ()
    """The vendor library's exception types: a query raising one of these leaves its value out."""

    def __init__(self, handles: dict[int, Any]) -> None:
        self.handles = handles
        self.energy = EnergyCounter()
        self.energy_unavailable: dict[int, str] = {}
        self._reported_failures: set[tuple[int, str]] = set()

    def sample(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for ordinal, handle in self.handles.items():
            values.update(self._sample_gpu(ordinal, handle))
        return values

    @abc.abstractmethod
    def _sample_gpu(self, ordinal: int, handle: Any) -> dict[str, float]:
        """This GPU's metrics (``gpu_<ordinal>_...``), its energy since the last sample included."""

    def _query(self, ordinal: int, what: str, query: Callable[..., Any], *args: Any) -> Any:
        """``query(*args)``, or None when the library refuses it; each refusal is logged once per GPU."""
        try:
            return query(*args)
        except self.errors as error:
            self._report_once(ordinal, what, error)
            return None

    def _report_once(self, ordinal: int, what: str, error: BaseException) -> None:
        if (ordinal, what) not in self._reported_failures:
            self._reported_failures.add((ordinal, what))
            LOGGER.info("GPU %d does not report %s (%s); leaving it out.", ordinal, what, error)
