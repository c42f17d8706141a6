"""AMD GPUs through amdsmi, against a fake amdsmi module: the MLflow names NVIDIA's GPUs get, only this job's
GPUs (ROCR_/HIP_/CUDA_VISIBLE_DEVICES as ROCm reads them), MI250X GCDs with the package's power on one GCD,
and the keys of several amdsmi releases. Nothing here ran on AMD hardware."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.callbacks.system import SystemMetricsCallback
from anemoi_profiler.measure import nvidia
from anemoi_profiler.measure.amd import AmdGpuResource
from anemoi_profiler.measure.nvidia import NvidiaGpuResource
from anemoi_profiler.measure.powercap import CpuPackageEnergy
from anemoi_profiler.measure.visible_devices import rocm_visible_gpu_uuids
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.fake_gpus import RESOLUTION_UJ, AmdSmiRelease, FakeGpu, fake_amdsmi, fake_nvml
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

U = [f"GPU-{serial:016x}" for serial in (0xA1, 0xB2, 0xC3, 0xD4, 0xE5, 0xF6, 0x17, 0x28)]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, dict(enumerate(U)), id="nothing-set-means-all"),
        pytest.param({"HIP_VISIBLE_DEVICES": "2,3"}, {0: U[2], 1: U[3]}, id="hip"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "5"}, {0: U[5]}, id="hip-honours-cuda"),
        pytest.param({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "6"}, {0: U[1]}, id="hip-before-cuda"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "4,5,6,7"}, {0: U[4], 1: U[5], 2: U[6], 3: U[7]}, id="rocr"),
        pytest.param(
            {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"},
            {0: U[5], 1: U[7]},
            id="hip-picks-from-what-rocr-left",
        ),
        pytest.param({"ROCR_VISIBLE_DEVICES": "GPU-00000000000000E5,0"}, {0: U[4], 1: U[0]}, id="rocr-uuid-any-case"),
        pytest.param({"HIP_VISIBLE_DEVICES": "3,9,1"}, {0: U[3]}, id="invalid-entry-stops"),
        pytest.param({"ROCR_VISIBLE_DEVICES": ""}, {}, id="empty-means-none"),
    ],
)
def test_rocm_visibility_maps_torch_ordinals_to_gpus(environ: dict[str, str], expected: dict[int, str]) -> None:
    assert rocm_visible_gpu_uuids(environ, U) == {ordinal: uuid.lower() for ordinal, uuid in expected.items()}


def mi250x_node() -> list[FakeGpu]:
    """Two MI250X packages, four GCDs; amdsmi lists them in another order than HIP's (hip_id)."""
    gcds = [
        FakeGpu(uuid=f"gcd{index}", serial=f"0x{index + 0xA0:016X}", hip_id=index, watts=90.0, integrate=False,
                used_bytes=index * 2**30, total_bytes=64 * 2**30, celsius=40 + index)
        for index in range(4)
    ]  # fmt: skip
    for secondary in (gcds[1], gcds[3]):
        secondary.watts = None  # the package's power is on its first GCD; the second says "N/A"
    return [gcds[2], gcds[0], gcds[3], gcds[1]]


def amd_resource(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], environ: dict[str, str] | None = None,
    release: AmdSmiRelease | None = None, ordinals: list[int] | None = None,
) -> AmdGpuResource:  # fmt: skip
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(gpus, release))
    resource = AmdGpuResource.for_this_job(environ or {}, ordinals)
    assert resource is not None
    return resource


def test_gcds_are_numbered_as_hip_numbers_them_and_each_package_is_counted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = mi250x_node()
    resource = amd_resource(monkeypatch, gpus)
    assert [handle.hip_id for handle in resource.handles.values()] == [0, 1, 2, 3]

    resource.sample()
    for gpu in gpus:
        if gpu.watts is not None:
            gpu.add_joules(1000.0 + gpu.hip_id)
    values = resource.sample()
    assert values["gpu_1_memory_usage_megabytes"] == pytest.approx(2**30 / 1e6)
    assert values["gpu_3_memory_usage_percentage"] == pytest.approx(100 * 3 / 64)
    assert values["gpu_2_temperature_celsius"] == 42.0
    assert values["gpu_0_utilization_percentage"] == 87.0
    assert values["gpu_0_power_usage_watts"] == values["gpu_2_power_usage_watts"] == 90.0
    # energy: the accumulator's counts times its resolution, on the GCD that carries its package
    count_joules = int(1000.0 * 1e6 / RESOLUTION_UJ) * RESOLUTION_UJ / 1e6
    assert values["gpu_0_energy_joules"] == pytest.approx(count_joules, abs=2 * RESOLUTION_UJ / 1e6)
    assert "gpu_2_energy_joules" in values
    assert not any(key.startswith(("gpu_1_power", "gpu_1_energy", "gpu_3_power", "gpu_3_energy")) for key in values)
    assert resource.power_elsewhere == {1, 3}
    assert resource.energy_unavailable == {}  # the second GCD is counted with its package, not missing


def test_amd_gpus_get_the_names_nvidia_gpus_get(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = [FakeGpu(uuid="a", serial="0xA1", hip_id=0, watts=350.0, integrate=False)]
    amd = amd_resource(monkeypatch, busy)
    amd.sample()
    busy[0].add_joules(5.0)
    monkeypatch.setattr(nvidia, "pynvml", fake_nvml([FakeGpu("GPU-1", watts=350.0)]))
    nvml = NvidiaGpuResource.for_this_job(None)
    assert nvml is not None
    nvml.sample()
    amd_values, nvml_values = amd.sample(), nvml.sample()
    assert set(amd_values) == set(nvml_values)
    assert amd_values["gpu_0_power_usage_watts"] == 350.0
    assert amd_values["gpu_0_power_usage_percentage"] == pytest.approx(100 * 350 / 700)  # cap in microwatts


def test_only_this_jobs_gcds_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    resource = amd_resource(monkeypatch, mi250x_node(), {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"})
    assert {ordinal: handle.hip_id for ordinal, handle in resource.handles.items()} == {0: 3}
    local_ranks = amd_resource(monkeypatch, mi250x_node(), ordinals=[1, 2])
    assert {ordinal: handle.hip_id for ordinal, handle in local_ranks.handles.items()} == {1: 1, 2: 2}


@pytest.mark.parametrize(
    "release",
    [
        pytest.param(AmdSmiRelease(energy_key="power", has_enumeration_info=False,
                                   power_keys=("average_socket_power",)), id="rocm-6.0"),
        pytest.param(AmdSmiRelease(power_keys=("current_socket_power", "average_socket_power")), id="rocm-6.2"),
    ],
)  # fmt: skip
def test_older_amdsmi_keys_are_read_too(monkeypatch: pytest.MonkeyPatch, release: AmdSmiRelease) -> None:
    gpus = [FakeGpu(uuid="a", serial="0xA1", hip_id=1, watts=480.0, integrate=False), FakeGpu(uuid="b", hip_id=0)]
    resource = amd_resource(monkeypatch, gpus, release=release)
    expected = ["a", "b"] if release.has_enumeration_info is False else ["b", "a"]  # no hip ids: amdsmi's order
    assert [handle.uuid for handle in resource.handles.values()] == expected
    resource.sample()
    gpus[0].add_joules(30.0)
    values, ordinal = resource.sample(), expected.index("a")
    assert values[f"gpu_{ordinal}_power_usage_watts"] == 480.0
    assert values[f"gpu_{ordinal}_energy_joules"] == pytest.approx(30.0, abs=1e-4)


def test_mi300x_power_comes_from_the_current_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid="a", serial="0xA1", hip_id=0, watts=600.0)
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([gpu]))
    smi = sys.modules["amdsmi"]
    smi.amdsmi_get_power_info = lambda handle: {"current_socket_power": 600, "average_socket_power": "N/A"}
    resource = AmdGpuResource.for_this_job({})
    assert resource is not None
    assert resource.sample()["gpu_0_power_usage_watts"] == 600.0


def test_without_amdsmi_there_are_no_gpu_metrics_and_one_line_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import raises ImportError
    with caplog.at_level(logging.INFO, logger="anemoi_profiler.measure"):
        assert AmdGpuResource.for_this_job({}) is None
    assert "install the amdsmi package of your ROCm" in caplog.text


def test_a_rocm_fit_logs_amd_gpus_under_mlflow_names_with_energy_per_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = [FakeGpu(uuid="a", serial="0xA1", hip_id=0, watts=400.0), FakeGpu(uuid="b", serial="0xB2", hip_id=1)]
    gpus[1].watts = None  # the second GCD of the package
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(gpus))
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")  # torch on ROCm: the callback asks amdsmi
    monkeypatch.setattr(SystemMetricsCallback, "_job_gpus", staticmethod(lambda trainer: [0, 1]))
    monkeypatch.setattr(CpuPackageEnergy, "readable", classmethod(lambda cls, root=None: None))
    config = ProfilerConfig.load(
        None,
        [f"output_dir={tmp_path}", "log_every_n_steps=10", "throughput.warmup_steps=3", "system.interval_s=0.05",
         "report.console=false", "tracking.enabled=false"],
    )  # fmt: skip
    train, val = loaders(n_train=16 * 60)
    trainer(build_callbacks(config), max_steps=60).fit(TinyRegressor(step_sleep_s=0.01), train, val)

    (folder,) = run_folders(tmp_path)
    report = json.loads((folder / "report.json").read_text())["sections"]
    system, throughput = report["System"]["data"], report["Throughput"]["data"]
    assert system["gpu_0_power_usage_watts"] == 400.0 and "gpu_1_power_usage_watts" not in system
    assert system["gpu_1_memory_usage_megabytes"] > 0
    assert system["energy/joules_per_sample"] == pytest.approx(400.0 / throughput["train/samples_per_sec"], rel=0.05)
    history = json.loads((folder / "metrics.json").read_text())
    assert names.gpu(0, "energy_joules") in json.dumps(history)
