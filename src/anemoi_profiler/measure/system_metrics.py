"""Machine metrics (CPU, memory, disk, network, GPUs) sampled off the training thread under MLflow's names.

Modelled on MLflow's ``mlflow/system_metrics/``: one small class per resource behind a tiny base class,
and a sampler thread that publishes ``system/<name>`` (or ``system/<node_id>/<name>``) so the MLflow UI
shows the values in its System metrics tab. Unlike MLflow, each sample carries the training step given by
``step_fn``, so machine behaviour lines up with the loss curves, and only the GPUs this job uses are read.
This module only measures; the caller's ``publish`` decides where the values go.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from anemoi_profiler import names
from anemoi_profiler.logs import get_logger
from anemoi_profiler.measure.amd import AmdGpuResource
from anemoi_profiler.measure.nvidia import NvidiaGpuResource
from anemoi_profiler.measure.powercap import POWERCAP_ROOT, CpuPackageEnergy
from anemoi_profiler.measure.resource import SystemResource
from anemoi_profiler.report_sections import MB

LOGGER = get_logger(__name__)

MIN_CPU_WINDOW_S = 0.1  # psutil's advice: shorter windows give noisy utilisation


class CpuResource(SystemResource):
    """System-wide CPU utilisation over the window since the previous sample.

    Keeps its own CPU-times window instead of ``psutil.cpu_percent()``'s per-thread global state, so
    that samples taken on different threads, or other psutil users in the process, don't skew it.
    """

    name = "cpu"

    def __init__(self) -> None:
        self._last_times = psutil.cpu_times()
        self._last_time_s = time.monotonic()

    def sample(self) -> dict[str, float]:
        # The first sample follows construction closely: wait for a window long enough to mean something.
        time.sleep(max(0.0, MIN_CPU_WINDOW_S - (time.monotonic() - self._last_time_s)))
        times = psutil.cpu_times()
        busy_s, total_s = _busy_and_total_s(times)
        last_busy_s, last_total_s = _busy_and_total_s(self._last_times)
        self._last_times, self._last_time_s = times, time.monotonic()
        window_s = total_s - last_total_s
        busy_share = (busy_s - last_busy_s) / window_s if window_s > 0 else 0.0
        return {"cpu_utilization_percentage": 100.0 * min(1.0, max(0.0, busy_share))}  # float noise


def _busy_and_total_s(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds, counted as psutil does (guest time is already in user/nice on Linux)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class MemoryResource(SystemResource):
    """Memory used by the whole node (the process's own RSS is logged elsewhere)."""

    name = "memory"

    def sample(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        return {
            "system_memory_usage_megabytes": memory.used / MB,
            "system_memory_usage_percentage": 100.0 * memory.used / memory.total,
        }


class DiskResource(SystemResource):
    """Usage of the file system holding ``path`` (where checkpoints and traces land, typically)."""

    name = "disk"

    def __init__(self, path: str = "/") -> None:
        self.path = path

    def sample(self) -> dict[str, float]:
        usage = psutil.disk_usage(self.path)
        return {
            "disk_usage_percentage": usage.percent,
            "disk_usage_megabytes": usage.used / MB,
            "disk_available_megabytes": usage.free / MB,
        }


class NetworkResource(SystemResource):
    """Bytes received and sent by the node since the first sample, as MLflow reports them."""

    name = "network"

    def __init__(self) -> None:
        self._initial: tuple[int, int] | None = None

    def sample(self) -> dict[str, float]:
        counters = psutil.net_io_counters()
        if self._initial is None:
            self._initial = (counters.bytes_recv, counters.bytes_sent)
        initial_received, initial_sent = self._initial
        return {
            "network_receive_megabytes": (counters.bytes_recv - initial_received) / MB,
            "network_transmit_megabytes": (counters.bytes_sent - initial_sent) / MB,
        }


def default_resources(
    disk_path: str = "/",
    gpu_ordinals: Iterable[int] | None = None,
    gpu_vendor: str = "nvidia",
    powercap_root: Path = POWERCAP_ROOT,
) -> list[SystemResource]:
    """The resources MLflow samples, this job's GPUs (NVML, or amdsmi with `gpu_vendor="amd"`) when the
    library can read them, and the CPU packages' energy where this process may read it."""
    resources: list[SystemResource] = [
        CpuResource(),
        MemoryResource(),
        DiskResource(disk_path),
        NetworkResource(),
    ]
    if gpu_vendor == "amd":
        gpus: SystemResource | None = AmdGpuResource.for_this_job(os.environ, gpu_ordinals)
    else:
        gpus = NvidiaGpuResource.for_this_job(os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_ordinals)
    if gpus is not None:
        resources.append(gpus)
    if cpu_energy := CpuPackageEnergy.readable(powercap_root):
        resources.append(cpu_energy)
    return resources


class SystemMetricsSampler:
    """Samples the resources every ``interval_s`` on a daemon thread and hands each sample to ``publish``.

    ``publish(metrics, step)`` gets ``{"system/<name>": value}`` (``system/<node_id>/<name>`` with a
    node id, MLflow's multi-node form) and ``step = step_fn()`` read at sampling time, so samples line
    up with training steps. The thread samples once as soon as it starts, so that even a short run has a
    sample, and ``stop()`` makes it take a last sample and exit. Nothing here raises into the caller: a
    failing resource, ``step_fn`` or ``publish`` is logged once and sampling goes on. The thread builds the
    resources, so the CPU window, network and energy counters begin when it starts.
    """

    def __init__(
        self,
        publish: Callable[[dict[str, float], int], None],
        step_fn: Callable[[], int],
        interval_s: float = 10.0,
        node_id: str | None = None,
        gpu_ordinals: list[int] | None = None,
        disk_path: str = "/",
        extra_resources: Sequence[SystemResource] = (),
        gpu_vendor: str = "nvidia",
        powercap_root: Path = POWERCAP_ROOT,
    ) -> None:
        self.publish = publish
        self.step_fn = step_fn
        self.interval_s = interval_s
        self.prefix = names.system("", node_id)
        self.gpu_ordinals = gpu_ordinals
        self.disk_path = disk_path
        self.gpu_vendor = gpu_vendor
        self.powercap_root = powercap_root
        self.extra_resources = list(extra_resources)
        self.resources: list[SystemResource] = []
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported_failures: set[str] = set()

    def start(self) -> None:
        """Start the sampling thread (once); it builds the resources and takes the first sample at once.

        Nothing of it runs on the caller's thread: the first CPU sample waits for a window long enough to
        mean something, and NVML's start-up takes its time, both while the training's first steps run.
        """
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="SystemMetricsSampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Have the thread take a last sample and exit; waits at most ``timeout_s``; safe to call again."""
        if self._thread is None or self._stop_event.is_set():
            return
        self._stop_event.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            LOGGER.warning("System metrics sampler did not stop within %.1f s; leaving it behind.", timeout_s)

    def _run(self) -> None:
        try:
            defaults = default_resources(self.disk_path, self.gpu_ordinals, self.gpu_vendor, self.powercap_root)
            self.resources = [*defaults, *self.extra_resources]
        except Exception as error:
            self._report_once("building the default resources", error)
            self.resources = list(self.extra_resources)
        self._sample_and_publish()
        stopping = False
        while not stopping:
            stopping = self._stop_event.wait(self.interval_s)
            self._sample_and_publish()

    def _sample_and_publish(self) -> None:
        metrics: dict[str, float] = {}
        for resource in self.resources:
            try:
                metrics.update({self.prefix + name: value for name, value in resource.sample().items()})
            except Exception as error:
                self._report_once(f"resource {resource.name!r}", error)
        try:
            self.publish(metrics, self.step_fn())
        except Exception as error:
            self._report_once("publish", error)

    def _report_once(self, what: str, error: Exception) -> None:
        if what not in self._reported_failures:
            self._reported_failures.add(what)
            LOGGER.warning("System metrics: %s failed (%r); further failures are not logged.", what, error)
