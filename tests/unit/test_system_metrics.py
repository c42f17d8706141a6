"""System metrics sampler: real psutil readings, MLflow's names, a thread that never hurts training."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time

import pytest

from anemoi_profiler import names
from anemoi_profiler.logs import PREFIX
from anemoi_profiler.measure.nvidia import NvidiaGpuResource
from anemoi_profiler.measure.system_metrics import MIN_CPU_WINDOW_S, SystemMetricsSampler, SystemResource
from anemoi_profiler.measure.visible_devices import visible_gpu_uuids

PSUTIL_NAMES = {
    "cpu_utilization_percentage",
    "system_memory_usage_megabytes",
    "system_memory_usage_percentage",
    "disk_usage_percentage",
    "disk_usage_megabytes",
    "disk_available_megabytes",
    "network_receive_megabytes",
    "network_transmit_megabytes",
}
GPU_NAMES = {
    "utilization_percentage",
    "memory_usage_megabytes",
    "memory_usage_percentage",
    "power_usage_watts",
    "power_usage_percentage",
    "temperature_celsius",
}
UUIDS = [
    "GPU-11111111-aaaa-0000-0000-000000000000",
    "GPU-22222222-bbbb-0000-0000-000000000000",
    "GPU-22223333-cccc-0000-0000-000000000000",
    "GPU-44444444-dddd-0000-0000-000000000000",
]


class Recorder:
    """A publish target that lets a test wait for a number of samples."""

    def __init__(self) -> None:
        self.samples: list[tuple[dict[str, float], int]] = []
        self._arrived = threading.Condition()

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        with self._arrived:
            self.samples.append((metrics, step))
            self._arrived.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.samples) >= count, timeout_s)


class BrokenResource(SystemResource):
    name = "broken"

    def sample(self) -> dict[str, float]:
        raise OSError("sensor unplugged")


class ConstantResource(SystemResource):
    name = "constant"

    def sample(self) -> dict[str, float]:
        return {"answer": 42.0}


def run_sampler(recorder: Recorder, samples: int, **kwargs: object) -> None:
    sampler = SystemMetricsSampler(recorder, step_fn=itertools.count().__next__, interval_s=0.05, **kwargs)
    sampler.start()
    recorder.wait_for(samples)
    sampler.stop()


def test_samples_carry_mlflow_names_plausible_values_and_training_steps() -> None:
    recorder = Recorder()
    run_sampler(recorder, samples=3)

    assert len(recorder.samples) >= 3
    assert [step for _, step in recorder.samples] == list(range(len(recorder.samples)))
    for metrics, _ in recorder.samples:
        leaves = {key.removeprefix(names.SYSTEM) for key in metrics}
        assert all(key.startswith(names.SYSTEM) for key in metrics)
        assert leaves >= PSUTIL_NAMES
        for name, value in metrics.items():
            if name.endswith("_percentage"):
                assert 0.0 <= value <= 100.0, name
        assert metrics[names.system("system_memory_usage_megabytes")] > 0
        assert metrics[names.system("disk_usage_megabytes")] > 0
        assert metrics[names.system("disk_available_megabytes")] > 0
        assert metrics[names.system("network_receive_megabytes")] >= 0
        assert metrics[names.system("network_transmit_megabytes")] >= 0
    first, _ = recorder.samples[0]
    assert first[names.system("network_receive_megabytes")] == 0.0  # cumulative since start, as in MLflow


def test_first_cpu_sample_measures_real_work() -> None:
    busy = threading.Event()

    def spin() -> None:
        while not busy.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        recorder = Recorder()
        sampler = SystemMetricsSampler(recorder, step_fn=lambda: 0, interval_s=60)
        sampler.start()
        sampler.stop()
    finally:
        busy.set()
    first, _ = recorder.samples[0]
    assert first[names.CPU_UTILIZATION] > 100.0 / (os.cpu_count() or 1) / 2


def test_node_id_gives_mlflow_multi_node_names() -> None:
    recorder = Recorder()
    run_sampler(recorder, samples=1, node_id="node-3")
    metrics, _ = recorder.samples[0]
    assert names.system("cpu_utilization_percentage", "node-3") in metrics
    assert all(key.startswith(names.system("", "node-3")) for key in metrics)


def test_start_costs_the_caller_nothing_samples_at_once_and_stop_is_prompt_final_and_idempotent() -> None:
    """The training thread calls start(): the first CPU sample's 0.1 s window and NVML's start-up are the
    sampler thread's, not the first training steps'."""
    recorder = Recorder()
    sampler = SystemMetricsSampler(recorder, step_fn=lambda: 7, interval_s=60)
    started = time.monotonic()
    sampler.start()
    assert time.monotonic() - started < MIN_CPU_WINDOW_S / 2
    recorder.wait_for(1)
    assert len(recorder.samples) == 1

    started = time.monotonic()
    sampler.stop()
    assert time.monotonic() - started < 1.0
    assert len(recorder.samples) == 2
    assert [step for _, step in recorder.samples] == [7, 7]

    sampler.stop()
    assert len(recorder.samples) == 2


def test_stop_before_start_does_nothing() -> None:
    recorder = Recorder()
    SystemMetricsSampler(recorder, step_fn=lambda: 0).stop()
    assert recorder.samples == []


def test_failing_publish_is_logged_once_and_sampling_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    calls = itertools.count()

    def flaky_publish(metrics: dict[str, float], step: int) -> None:
        if next(calls) < 3:
            raise ConnectionError("tracking server away")
        recorder(metrics, step)

    with caplog.at_level(logging.WARNING, logger="anemoi_profiler.measure.system_metrics"):
        sampler = SystemMetricsSampler(flaky_publish, step_fn=lambda: 0, interval_s=0.05)
        sampler.start()
        recorder.wait_for(2)
        sampler.stop()

    assert [record.getMessage() for record in caplog.records if "publish" in record.getMessage()] == [
        f"{PREFIX}System metrics: publish failed (ConnectionError('tracking server away')); "
        "further failures are not logged."
    ]


def test_failing_step_fn_is_logged_once_and_sampling_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    steps = itertools.count()

    def step_fn() -> int:
        step = next(steps)
        if step < 2:
            raise RuntimeError("trainer not attached yet")
        return step

    with caplog.at_level(logging.WARNING, logger="anemoi_profiler.measure.system_metrics"):
        sampler = SystemMetricsSampler(recorder, step_fn=step_fn, interval_s=0.05)
        sampler.start()
        recorder.wait_for(2)
        sampler.stop()

    assert recorder.samples[0][1] == 2
    assert len(caplog.records) == 1


def test_failing_resource_is_logged_once_and_others_continue(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler.measure.system_metrics"):
        run_sampler(recorder, samples=3, extra_resources=[BrokenResource(), ConstantResource()])

    assert [record.getMessage() for record in caplog.records] == [
        f"{PREFIX}System metrics: resource 'broken' failed (OSError('sensor unplugged')); "
        "further failures are not logged."
    ]
    for metrics, _ in recorder.samples:
        assert metrics[names.system("answer")] == 42.0
        assert names.CPU_UTILIZATION in metrics


def test_missing_disk_path_loses_only_disk_metrics(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler.measure.system_metrics"):
        run_sampler(recorder, samples=2, disk_path="/no/such/folder")

    assert len(caplog.records) == 1
    assert "'disk'" in caplog.records[0].getMessage()
    metrics, _ = recorder.samples[-1]
    assert not any("disk" in key for key in metrics)
    assert names.system("system_memory_usage_percentage") in metrics


def test_gpu_metrics_appear_exactly_when_nvml_reads_gpus(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="anemoi_profiler.measure"):
        gpus = NvidiaGpuResource.for_this_job(os.environ.get("CUDA_VISIBLE_DEVICES"))
        recorder = Recorder()
        run_sampler(recorder, samples=1)

    metrics, _ = recorder.samples[-1]
    gpu_keys = {key for key in metrics if key.startswith(names.system("gpu_"))}
    if gpus is None:
        assert gpu_keys == set()
        assert any(record.getMessage().startswith(f"{PREFIX}No GPU system metrics") for record in caplog.records)
    else:
        expected = {names.gpu(ordinal, name) for ordinal in gpus.handles for name in GPU_NAMES}
        assert gpu_keys <= expected
        for ordinal in gpus.handles:
            assert metrics[names.gpu(ordinal, "memory_usage_megabytes")] > 0
        for key in gpu_keys:
            assert metrics[key] >= 0, key
            if key.endswith("_percentage"):
                assert metrics[key] <= 100.0, key


@pytest.mark.parametrize(
    ("cuda_visible_devices", "expected"),
    [
        pytest.param(None, dict(enumerate(UUIDS)), id="unset-means-all"),
        pytest.param("", {}, id="empty-means-none"),
        pytest.param("-1", {}, id="negative-means-none"),
        pytest.param("2,0", {0: UUIDS[2], 1: UUIDS[0]}, id="ordinal-is-position"),
        pytest.param(" 3 , 1 ", {0: UUIDS[3], 1: UUIDS[1]}, id="spaces"),
        pytest.param("1gpu,2x", {0: UUIDS[1], 1: UUIDS[2]}, id="leading-digits-like-strtoul"),
        pytest.param("1,7,2", {0: UUIDS[1]}, id="out-of-range-stops"),
        pytest.param("0,,2", {0: UUIDS[0]}, id="empty-entry-stops"),
        pytest.param("1,1", {}, id="repeat-hides-all"),
        pytest.param("GPU-4444,GPU-11111111-aaaa", {0: UUIDS[3], 1: UUIDS[0]}, id="uuid-prefixes"),
        pytest.param("GPU-11111111-aaaa-0000-0000-000000000000", {0: UUIDS[0]}, id="full-uuid"),
        pytest.param("GPU-1111,GPU-2222,GPU-4444", {0: UUIDS[0]}, id="ambiguous-prefix-stops"),
        pytest.param("GPU-9999", {}, id="unknown-uuid-stops"),
        pytest.param("3,GPU-1111", {0: UUIDS[3], 1: UUIDS[0]}, id="mixed-forms"),
        pytest.param("0,GPU-11111111", {}, id="same-gpu-by-index-and-uuid"),
        pytest.param(
            "MIG-5c0bd8a1-0000-5000-8000-000000000001",
            {0: "MIG-5c0bd8a1-0000-5000-8000-000000000001"},
            id="mig-uuid-passes-to-nvml",
        ),
    ],
)
def test_cuda_visible_devices_maps_cuda_ordinals_to_nvml_uuids(
    cuda_visible_devices: str | None, expected: dict[int, str]
) -> None:
    assert visible_gpu_uuids(cuda_visible_devices, UUIDS) == expected


def test_gpu_ordinals_keep_the_local_ranks_devices() -> None:
    assert visible_gpu_uuids("3,2,1", UUIDS, gpu_ordinals=[2, 0, 5]) == {0: UUIDS[3], 2: UUIDS[1]}
    assert visible_gpu_uuids(None, UUIDS, gpu_ordinals=[1]) == {1: UUIDS[1]}
    assert visible_gpu_uuids(None, UUIDS, gpu_ordinals=[]) == {}
