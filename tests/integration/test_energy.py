"""Energy: NVML's counter per GPU and RAPL's per CPU package, read at the system interval; the steady-state energy
per sample over real Lightning fits, against a fake NVML whose counters integrate a power the test sets."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.callbacks.system import SystemMetricsCallback
from anemoi_profiler.measure import nvidia
from anemoi_profiler.measure.energy import EnergyShare, EnergyTally
from anemoi_profiler.measure.nvidia import NO_ENERGY_COUNTER, NvidiaGpuResource
from anemoi_profiler.measure.powercap import CpuPackageEnergy, why_no_cpu_energy
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.fake_gpus import FakeGpu, NVMLError, fake_nvml
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

UUIDS = ["GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"]


def nvidia_gpus(monkeypatch: pytest.MonkeyPatch, *gpus: FakeGpu) -> list[FakeGpu]:
    monkeypatch.setattr(nvidia, "pynvml", fake_nvml(list(gpus)))
    return list(gpus)


# ---- the NVML counter, sample by sample ----


def test_energy_per_interval_is_the_counters_increase(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu, other = nvidia_gpus(monkeypatch, FakeGpu(UUIDS[0], watts=0.0), FakeGpu(UUIDS[1], watts=0.0))
    resource = NvidiaGpuResource.for_this_job(None, [0, 1])
    assert resource is not None

    first = resource.sample()
    assert "gpu_0_energy_joules" not in first  # the first reading only sets the base
    assert first["gpu_0_power_usage_watts"] == 0.0 and first["gpu_0_memory_usage_megabytes"] == 30_000.0
    gpu.add_joules(1500.0)
    other.add_joules(20.0)
    second = resource.sample()
    assert (second["gpu_0_energy_joules"], second["gpu_1_energy_joules"]) == (1500.0, 20.0)
    assert resource.sample()["gpu_0_energy_joules"] == 0.0  # nothing drawn since


def test_a_counter_that_went_back_only_sets_a_new_base(monkeypatch: pytest.MonkeyPatch) -> None:
    (gpu,) = nvidia_gpus(monkeypatch, FakeGpu(UUIDS[0], watts=0.0))
    resource = NvidiaGpuResource.for_this_job(None)
    assert resource is not None
    gpu.add_joules(900.0)
    resource.sample()
    gpu.reset_counter()  # a driver reload
    assert "gpu_0_energy_joules" not in resource.sample()
    gpu.add_joules(7.0)
    assert resource.sample()["gpu_0_energy_joules"] == 7.0


def test_a_missed_reading_does_not_give_one_interval_two_intervals_energy(monkeypatch: pytest.MonkeyPatch) -> None:
    (gpu,) = nvidia_gpus(monkeypatch, FakeGpu(UUIDS[0], watts=0.0))
    resource = NvidiaGpuResource.for_this_job(None)
    assert resource is not None
    resource.sample()
    real = nvidia.pynvml.nvmlDeviceGetTotalEnergyConsumption

    def busy(handle: object) -> int:
        raise NVMLError("GPU is lost")

    monkeypatch.setattr(nvidia.pynvml, "nvmlDeviceGetTotalEnergyConsumption", busy)
    gpu.add_joules(100.0)
    assert "gpu_0_energy_joules" not in resource.sample()
    monkeypatch.setattr(nvidia.pynvml, "nvmlDeviceGetTotalEnergyConsumption", real)
    gpu.add_joules(100.0)
    assert "gpu_0_energy_joules" not in resource.sample()  # a new base: the missed 100 J are not put here
    gpu.add_joules(5.0)
    assert resource.sample()["gpu_0_energy_joules"] == 5.0
    assert not resource.energy_unavailable  # passing: not reported as unsupported


def test_a_gpu_without_an_energy_counter_says_so_and_keeps_its_other_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    nvidia_gpus(monkeypatch, FakeGpu(UUIDS[0], energy_supported=False), FakeGpu(UUIDS[1]))
    resource = NvidiaGpuResource.for_this_job("1,0")
    assert resource is not None
    resource.sample()
    values = resource.sample()
    assert resource.energy_unavailable == {1: NO_ENERGY_COUNTER}  # CUDA ordinal 1 is NVML's GPU 0
    assert "gpu_1_energy_joules" not in values and "gpu_0_energy_joules" in values
    assert values["gpu_1_utilization_percentage"] == 87.0


# ---- RAPL through powercap ----


def powercap_tree(root: Path, zones: dict[str, tuple[str, int | None, int]]) -> Path:
    """`zones`: folder -> (name, energy_uj or None for unreadable, max_energy_range_uj)."""
    for folder, (name, energy_uj, range_uj) in zones.items():
        zone = root / folder
        zone.mkdir(parents=True)
        (zone / "name").write_text(name + "\n")
        (zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
        (zone / "energy_uj").write_text(f"{energy_uj}\n")
    return root


def set_energy(root: Path, folder: str, energy_uj: int) -> None:
    (root / folder / "energy_uj").write_text(f"{energy_uj}\n")


def test_cpu_packages_count_once_and_a_wrapping_counter_is_undone(tmp_path: Path) -> None:
    range_uj = 262_143_328_850
    root = powercap_tree(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", range_uj - 1_000_000, range_uj),
            "intel-rapl:1": ("package-1", 5_000_000, range_uj),
            "intel-rapl:0:0": ("core", 1, range_uj),  # inside package-0's figure
            "intel-rapl:2": ("psys", 1, range_uj),  # the platform: contains the packages
            "intel-rapl-mmio:0": ("package-0", 1, range_uj),  # package-0 again, through MMIO
        },
    )
    resource = CpuPackageEnergy.readable(root)
    assert resource is not None
    assert [zone.name for zone in resource.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert resource.sample() == {}
    set_energy(root, "intel-rapl:0", 2_000_000)  # wrapped: 1 J before the wrap, 2 J after
    set_energy(root, "intel-rapl:1", 9_000_000)
    set_energy(root, "intel-rapl:0:0", 10**9)
    assert resource.sample() == {"cpu_energy_joules": pytest.approx(3.0 + 4.0)}


def test_unreadable_or_absent_rapl_gives_no_cpu_energy_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="anemoi_profiler.measure"):
        assert CpuPackageEnergy.readable(tmp_path / "no-powercap") is None
        root = powercap_tree(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 5, 100)})
        real_read = Path.read_text

        def root_only(path: Path, *args: Any, **kwargs: Any) -> str:
            if path.name == "energy_uj":  # what Linux >= 5.10 does for a user who is not root
                raise PermissionError(13, "Permission denied", str(path))
            return real_read(path, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", root_only)
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        assert CpuPackageEnergy.readable(root) is None
        assert "root only since Linux 5.10: run as root" in why_no_cpu_energy(root)
        monkeypatch.setattr(os, "geteuid", lambda: 0)  # root is never told that the counters are root's only
        assert CpuPackageEnergy.readable(root) is None
        assert "is not readable, even by root (" in why_no_cpu_energy(root)
        assert "root only" not in why_no_cpu_energy(root)
    messages = [record.getMessage() for record in caplog.records]
    assert any("no RAPL package zones" in message for message in messages)
    assert any("is not readable" in message and "root only since Linux 5.10" in message for message in messages)
    assert any("even by root" in message for message in messages)
    assert why_no_cpu_energy(tmp_path / "no-powercap").startswith("no RAPL package zone in")


# ---- the tally and the job's figures ----


def test_the_tally_keeps_steady_state_intervals_apart() -> None:
    tally = EnergyTally()
    tally.add({"gpu_0_energy_joules": 3000.0, "cpu_utilization_percentage": 50.0}, 1.0, steady=False)  # warmup
    tally.add({"gpu_0_energy_joules": 500.0, "gpu_1_energy_joules": 250.0, "cpu_energy_joules": 90.0}, 1.0, True)
    tally.add({"gpu_0_energy_joules": 1000.0, "gpu_1_energy_joules": 500.0, "cpu_energy_joules": 180.0}, 2.0, True)
    assert tally.joules(gpu=True) == 5250.0
    assert tally.joules(gpu=False) == 270.0
    assert tally.steady_watts(gpu=True) == 500.0 + 250.0
    assert tally.counters(gpu=True) == 2
    tally.add({"gpu_2_energy_joules": 10.0}, 1.0, steady=False)  # a counter with no steady-state interval
    assert tally.steady_watts(gpu=True) is None


def test_job_figures_sum_the_nodes_and_count_each_replicas_samples_once() -> None:
    # Two nodes of two ranks, tensor parallel in pairs: world size 4, data-parallel size 2.
    def rank(node_share: dict[str, float] | None) -> list[float]:
        return EnergyShare(**(node_share or {})).to_list()

    node = {"nodes": 1, "gpus": 2, "gpu_counters": 2, "gpu_joules": 7.2e6, "cpu_counters": 1, "cpu_joules": 3.6e6}
    ranks = [
        rank({**node, "steady_gpu_watts": 600.0}),
        rank(None),  # the ranks that do not sample a node bring nothing
        rank({**node, "steady_gpu_watts": 400.0}),
        rank(None),
    ]
    summary, notes = EnergyShare.total(ranks).figures(10.0, [], samples_per_sec=2000.0)
    assert summary == {
        names.SUMMARY_GPU_KWH: pytest.approx(4.0),
        names.SUMMARY_JOULES_PER_SAMPLE: pytest.approx(1000.0 / 2000),  # the job's power over its steady samples/s
        names.SUMMARY_CPU_KWH: pytest.approx(2.0),
    }
    assert any("a GPU shared with other jobs counts their energy too" in note for note in notes)


def test_job_figures_say_not_available_and_why() -> None:
    missing = EnergyShare(nodes=1, gpus=2, gpus_without_counter=1, gpu_counters=1, gpu_joules=10.0)
    summary, notes = EnergyShare.total([missing.to_list()]).figures(10.0, [NO_ENERGY_COUNTER], 5.0)
    assert names.SUMMARY_GPU_KWH not in summary
    assert notes[0] == f"GPU energy: not available (1 of 2 GPUs have no energy counter: {NO_ENERGY_COUNTER})."
    assert notes[-1].startswith("CPU package energy: not available (")

    short = EnergyShare(nodes=1, gpus=1, gpu_counters=1, gpu_joules=10.0, no_steady_interval=1)
    summary, notes = short.figures(30.0, [], 5.0)
    assert set(summary) == {names.SUMMARY_GPU_KWH}
    assert "they are 30 s apart: lower system.interval_s" in notes[0]


# ---- real fits with fake GPUs ----


SLOW_STEPS = range(100, 120)
"""Global steps that sleep 4x as long: at least one log interval of 20 is a slow stretch, which the headline sets
apart, whatever else loads the machine."""


class PhasedPower(TinyRegressor):
    """High power in warmup and validation, steady power in steady-state training: only the latter must count.
    The steps in `SLOW_STEPS` sleep 40 ms instead of 10: a slow stretch at the steady power."""

    def __init__(self, gpus: list[FakeGpu], steady_watts: list[float], warmup: int) -> None:
        super().__init__(step_sleep_s=0.01)
        self.gpus, self.steady_watts, self.warmup = gpus, steady_watts, warmup

    def _set(self, watts: list[float]) -> None:
        for gpu, value in zip(self.gpus, watts, strict=True):
            gpu.set_watts(value)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._set([4 * w for w in self.steady_watts] if self.global_step < self.warmup else self.steady_watts)
        self.step_sleep_s = 0.04 if self.global_step in SLOW_STEPS else 0.01
        return super().training_step(batch, batch_idx)

    def on_validation_start(self) -> None:
        self._set([3 * w for w in self.steady_watts])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(0.02)
        super().validation_step(batch, batch_idx)

    def on_validation_end(self) -> None:
        self._set(self.steady_watts)


def energy_config(tmp_path: Path, *overrides: str) -> ProfilerConfig:
    return ProfilerConfig.load(
        None,
        [f"output_dir={tmp_path / 'runs'}", "log_every_n_steps=20", "throughput.warmup_steps=5",
         "system.interval_s=0.05", "report.console=false", "tracking.enabled=false", *overrides],
    )  # fmt: skip


@pytest.fixture
def two_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> list[FakeGpu]:
    """Two NVIDIA GPUs that this node's ranks use (on CPU, the trainer's devices name none)."""
    gpus = nvidia_gpus(monkeypatch, FakeGpu(UUIDS[0], watts=0.0), FakeGpu(UUIDS[1], watts=0.0))
    monkeypatch.setattr(SystemMetricsCallback, "_job_gpus", staticmethod(lambda trainer: [0, 1]))
    monkeypatch.setattr(CpuPackageEnergy, "readable", classmethod(lambda cls, root=None: None))
    return gpus


def read_report(tmp_path: Path) -> dict[str, Any]:
    (folder,) = run_folders(tmp_path / "runs")
    return json.loads((folder / "report.json").read_text())["sections"]


@pytest.mark.slow
def test_energy_per_sample_counts_steady_state_power_only(
    tmp_path: Path, two_fake_gpus: list[FakeGpu], sqlite_uri: str
) -> None:
    from lightning.pytorch.loggers import MLFlowLogger

    steady_watts = [300.0, 150.0]
    model = PhasedPower(two_fake_gpus, steady_watts, warmup=5)
    train, val = loaders(n_train=16 * 150, n_val=16 * 5)
    logger = MLFlowLogger(experiment_name="energy", tracking_uri=sqlite_uri)
    callbacks = build_callbacks(energy_config(tmp_path, "tracking.enabled=true"))
    trainer(callbacks, logger=logger, val_check_interval=50).fit(model, train, val)

    report = read_report(tmp_path)
    system, throughput = report["System"]["data"], report["Throughput"]["data"]
    assert throughput["train/slow_stretch_s"] > 0  # the slow steps' interval is set apart from the headline
    # steady power x steady seconds / steady samples over the headline's own intervals = power / its samples/s
    expected = sum(steady_watts) / throughput["train/samples_per_sec"]
    assert system["energy/joules_per_sample"] == pytest.approx(expected, rel=0.05)
    # the run's energy per sample, warmup and validation (at 3-4x the power) included, is far more
    run_joules_per_sample = system["energy/gpu_kwh"] * 3.6e6 / (throughput["train/measured_batches"] * 16)
    assert run_joules_per_sample > 1.2 * system["energy/joules_per_sample"]
    note = report["System"]["note"]
    assert "a GPU shared with other jobs counts their energy too" in note
    assert "CPU package energy: not available" in note

    wait_for_mlflow()
    client = MlflowClient(sqlite_uri)
    run = client.get_run(logger.run_id)
    assert run.data.metrics[names.SUMMARY_JOULES_PER_SAMPLE] == pytest.approx(system["energy/joules_per_sample"])
    per_interval = [m.value for m in client.get_metric_history(logger.run_id, names.gpu(0, "energy_joules"))]
    per_interval += [m.value for m in client.get_metric_history(logger.run_id, names.gpu(1, "energy_joules"))]
    assert run.data.metrics[names.SUMMARY_GPU_KWH] * 3.6e6 == pytest.approx(sum(per_interval), rel=1e-6)


def test_a_gpu_without_energy_counter_leaves_the_figures_out_and_says_why(
    tmp_path: Path, two_fake_gpus: list[FakeGpu]
) -> None:
    two_fake_gpus[1].energy_supported = False
    train, val = loaders(n_train=16 * 30)
    trainer(build_callbacks(energy_config(tmp_path)), max_steps=30).fit(TinyRegressor(step_sleep_s=0.01), train, val)
    report = read_report(tmp_path)
    system = report["System"]
    assert not any(key.startswith("energy/") for key in system["data"])
    assert f"GPU energy: not available (1 of 2 GPUs have no energy counter: {NO_ENERGY_COUNTER})" in system["note"]
    assert "gpu_1_utilization_percentage" in system["data"]  # the rest of the GPU's metrics are there


def test_without_throughput_there_is_energy_but_no_energy_per_sample(
    tmp_path: Path, two_fake_gpus: list[FakeGpu]
) -> None:
    for gpu in two_fake_gpus:
        gpu.set_watts(100.0)
    train, val = loaders(n_train=16 * 30)
    callbacks = build_callbacks(energy_config(tmp_path, "throughput.enabled=false"))
    trainer(callbacks, max_steps=30).fit(TinyRegressor(step_sleep_s=0.01), train, val)
    report = read_report(tmp_path)
    system = report["System"]
    assert system["data"]["energy/gpu_kwh"] > 0
    assert "energy/joules_per_sample" not in system["data"]
    assert "Energy per sample: not available (no steady samples/s: ThroughputCallback measures them)" in system["note"]
