"""The diagnosis: each verdict fires on the numbers it should, stays quiet otherwise, and never raises.

Constructed runs carry the values a run folder would hold; the HTA numbers are those HTA 0.6 computes for
the shared fixtures (`traces/h200_single_gpu`: a launch-bound H200 fit; `traces/hta_sampled_2rank`: an
NCCL job with exposed communication). Two real fits check the end-to-end case: a dataloader that sleeps
is dataloader-bound, a compute-bound step is not.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.cli.summarize_command import summarize_folder
from anemoi_profiler.reports import steady
from anemoi_profiler.reports.diagnosis import (
    NotAssessed,
    Verdict,
    assess,
    communication_bound,
    dataloader_bound,
    diagnose,
    host_bound,
    low_mfu,
    memory_use,
    render_section,
    slow_rank,
)
from anemoi_profiler.reports.run_data import RunData, RunFolderError, load_run
from anemoi_profiler.run_files.layout import run_folders, window_summary_path
from tests.helpers.lightning_models import SlowSamples, TinyRegressor, loaders, trainer

H200 = {"accelerator": "CUDAAccelerator", "devices": [{"index": 0, "name": "NVIDIA H200", "memory_mb": 150_000}]}
CPU = {"accelerator": "CPUAccelerator", "devices": []}
H200_SINGLE_GPU_HTA = {  # HTA over traces/h200_single_gpu: GPU idle 54%, 95% of it waiting for the host
    names.hta_window("train/window_0", names.hta_rank(0, "idle_pct")): 54.42,
    names.hta_window("train/window_0", names.hta_rank(0, "compute_pct")): 45.17,
    names.hta_window("train/window_0", names.hta_rank(0, "idle_host_wait_share_pct")): 94.74,
    names.hta_window("train/window_0", names.hta_rank(0, "idle_kernel_wait_share_pct")): 5.26,
    names.hta_window("train/window_0", names.hta_all_ranks("computation_kernel_time_pct")): 99.0,
}
NCCL_2RANK_HTA = {  # HTA over traces/hta_sampled_2rank: communication 55% of kernel time, 12-20% overlapped
    names.hta_window("train/window_0", names.hta_rank(0, "comm_comp_overlap_pct")): 11.81,
    names.hta_window("train/window_0", names.hta_rank(1, "comm_comp_overlap_pct")): 20.05,
    names.hta_window("train/window_0", names.hta_all_ranks("communication_kernel_time_pct")): 55.5,
}


def run_with(
    summary: dict[str, float] | None = None,
    environment: dict[str, Any] | None = None,
    hta: dict[str, float] | None = None,
    **parts: Any,
) -> RunData:
    metrics = {
        names.summary(key): {"step": [100], "value": [value], "time": [0.0]} for key, value in (summary or {}).items()
    }
    return RunData(Path("run"), metrics=metrics, environment=environment or CPU, hta={"metrics": hta or {}}, **parts)


def time_report(device_ms_per_op: list[float], steps: int = 3) -> dict[str, Any]:
    operators = [
        {"operator": f"op{i}", "self_device_ms": ms, "self_cpu_ms": 1.0} for i, ms in enumerate(device_ms_per_op)
    ]
    return {"windows": [{"stage": "train", "window": 0, "steps": steps, "device": True, "operators": operators}]}


# ---- dataloader ----
@pytest.mark.parametrize(("wait_ms", "severity"), [(30.0, "medium"), (60.0, "high")])
def test_dataloader_bound_fires_with_the_share_of_step_time(wait_ms: float, severity: str) -> None:
    verdict = dataloader_bound(run_with({"train/step_ms": 100.0, "train/dataloader_wait_ms": wait_ms}))
    assert isinstance(verdict, Verdict)
    assert (verdict.name, verdict.severity) == ("dataloader-bound", severity)
    assert f"{wait_ms / 100:.0%} of training step time" in verdict.value
    assert "num_workers" in verdict.next_step and "pin_memory" in verdict.next_step


def test_the_steady_figures_decide_not_an_interval_the_profiler_slowed_down() -> None:
    """The demo on an H200 (run folder of the device check): the first interval holds the memory snapshot dump
    and the trace and timeline exports between batches, which the run's mean counted as data wait. The steady
    figures (what the callbacks write as `summary/...`) set that interval apart as a slow stretch."""
    step_ms, wait_ms = [285.6, 9.1, 8.5, 9.1, 9.9], [274.8, 1.4, 1.2, 1.3, 1.6]
    intervals = [
        steady.Interval(
            25 * (k + 1), 25, step * 25 / 1000, {names.TRAIN_STEP_MS: step, names.TRAIN_DATALOADER_WAIT_MS: wait}
        )
        for k, (step, wait) in enumerate(zip(step_ms, wait_ms, strict=True))
    ]
    split = steady.split(intervals)
    assert split.slow == intervals[:1]
    figures = steady.combined(split.steady)
    verdict = dataloader_bound(
        run_with({names.summary_of(key).removeprefix(names.SUMMARY): value for key, value in figures.items()}, H200)
    )
    assert isinstance(verdict, Verdict)
    assert verdict.severity == "medium"  # not the 85% of the run's mean
    assert verdict.value == "15% of training step time waits for data (1.4 of 9.2 ms per batch, steady state)"


def test_dataloader_quiet_below_threshold_and_not_assessed_without_step_times() -> None:
    assert dataloader_bound(run_with({"train/step_ms": 100.0, "train/dataloader_wait_ms": 5.0})) is None
    assert isinstance(dataloader_bound(run_with({})), NotAssessed)


# ---- host / launch ----
def test_host_bound_from_htas_idle_breakdown() -> None:
    verdict = host_bound(run_with({"train/step_ms": 24.0, "train/dataloader_wait_ms": 0.2}, H200, H200_SINGLE_GPU_HTA))
    assert isinstance(verdict, Verdict)
    assert verdict.severity == "high"
    assert verdict.value == (
        "the GPU waits for the host 51% of the step (HTA over train/window_0: GPU idle 54%, 95% of it waiting for "
        "the host)"
    )
    assert "CUDA graphs" in verdict.next_step and "torch.compile" in verdict.next_step


def test_host_bound_beyond_the_data_wait_is_judged_on_the_time_left() -> None:
    """The demo on an H200 (run folder of the device check): 85% data wait, and the GPU idles through nearly
    all of the rest (HTA ran on the validation window only: HTA could not load that training trace)."""
    hta = {
        names.hta_window("val/window_0", names.hta_rank(0, "idle_pct")): 98.83,
        names.hta_window("val/window_0", names.hta_rank(0, "idle_host_wait_share_pct")): 99.93,
    }
    step = {"train/step_ms": 56.95, "train/dataloader_wait_ms": 48.54}
    verdict = host_bound(run_with(step, H200, hta))
    assert isinstance(verdict, Verdict)
    assert verdict.severity == "medium"
    assert verdict.value.startswith(
        "beyond the 85% data wait, the GPU waits for the host 14% of the step, 92% of the time left (HTA over "
        "val/window_0: GPU idle 99%"
    )


def test_host_bound_quiet_when_the_gpu_is_busy_or_the_idle_is_data_wait() -> None:
    busy = {**H200_SINGLE_GPU_HTA, names.hta_window("train/window_0", names.hta_rank(0, "idle_pct")): 8.0}
    assert host_bound(run_with({"train/step_ms": 24.0}, H200, busy)) is None
    data_wait = {"train/step_ms": 100.0, "train/dataloader_wait_ms": 50.0}  # 52% host wait, 50% of it data
    assert host_bound(run_with(data_wait, H200, H200_SINGLE_GPU_HTA)) is None


def test_host_bound_without_hta_from_the_kernel_time_per_step() -> None:
    step = {"train/step_ms": 100.0, "train/dataloader_wait_ms": 2.0}
    idle = host_bound(run_with(step, H200, time_report=time_report([30.0, 15.0])))  # 15 ms busy of 100
    assert isinstance(idle, Verdict)
    assert idle.value == (
        "beyond the 2% data wait, the GPU waits for the host 83% of the step, 85% of the time left (GPU kernels "
        "busy 15.0 of 100.0 ms per step, top operators of the profiled steps)"
    )
    assert host_bound(run_with(step, H200, time_report=time_report([200.0, 60.0]))) is None  # 87% busy


def test_kernel_time_counts_each_kernel_once() -> None:
    """A kernel is a row of its own and part of its launching operator's self device time."""
    operators = [
        {"operator": "aten::mm", "self_cpu_ms": 2.0, "self_device_ms": 0.9},
        {"operator": "sm90_gemm", "self_cpu_ms": 0.0, "self_device_ms": 0.9},
        {"operator": "aten::add", "self_cpu_ms": 1.0, "self_device_ms": 0.3},
    ]
    report = {"windows": [{"stage": "train", "steps": 3, "device": True, "operators": operators}]}
    assert run_with(time_report=report).device_busy_ms_per_step() == pytest.approx(0.4)


def test_host_bound_is_not_assessed_on_cpu_or_without_data() -> None:
    assert isinstance(host_bound(run_with({"train/step_ms": 10.0})), NotAssessed)
    assert isinstance(host_bound(run_with({"train/step_ms": 10.0}, H200)), NotAssessed)


# ---- communication and rank balance ----
def test_communication_bound_from_htas_overlap() -> None:
    verdict = communication_bound(run_with({}, H200, NCCL_2RANK_HTA))
    assert isinstance(verdict, Verdict)
    assert verdict.severity == "high"
    assert "communication kernels 56% of GPU kernel time; 16% of communication time overlaps" in verdict.value
    assert "least: rank 0, 12%" in verdict.value


def summarized_run(tmp_path: Path, fixtures_dir: Path, traces: str, summary: dict[str, float]) -> RunData:
    """A run folder without HTA whose training window has the window summary of a fixture's traces."""
    table = summarize_folder(fixtures_dir / "traces" / traces)
    path = window_summary_path(tmp_path, "train", 0, ".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(table.to_json()))
    return dataclasses.replace(run_with(summary, H200), folder=tmp_path)


def test_without_hta_the_window_summary_gives_the_host_bound_verdict(tmp_path: Path, fixtures_dir: Path) -> None:
    run = summarized_run(tmp_path, fixtures_dir, "h200_single_gpu", {"train/step_ms": 24.0})
    verdict = host_bound(run)
    assert isinstance(verdict, Verdict) and verdict.severity == "high"
    assert verdict.value == (
        "the GPU waits for the host 51% of the step (the window summary over train/window_0: GPU idle 53%, 96% of "
        "it waiting for the host)"
    )


def test_without_hta_the_window_summary_gives_the_communication_verdict(tmp_path: Path, fixtures_dir: Path) -> None:
    verdict = communication_bound(summarized_run(tmp_path, fixtures_dir, "hta_sampled_2rank", {}))
    assert isinstance(verdict, Verdict) and verdict.severity == "high"
    # HTA's kernel type breakdown (communication running alone, over both ranks' kernel time): HTA says 56.4%
    assert "communication kernels 56% of GPU kernel time; 17% of communication time overlaps" in verdict.value
    assert "(the window summary; least: rank 0, 15%)" in verdict.value


def test_communication_quiet_when_overlapped_or_small() -> None:
    overlapped = {
        **NCCL_2RANK_HTA,
        names.hta_window("train/window_0", names.hta_rank(0, "comm_comp_overlap_pct")): 85.0,
    }
    overlapped[names.hta_window("train/window_0", names.hta_rank(1, "comm_comp_overlap_pct"))] = 90.0
    assert communication_bound(run_with({}, H200, overlapped)) is None
    small = {
        **NCCL_2RANK_HTA,
        names.hta_window("train/window_0", names.hta_all_ranks("communication_kernel_time_pct")): 4.0,
    }
    assert communication_bound(run_with({}, H200, small)) is None
    assert isinstance(communication_bound(run_with({}, H200)), NotAssessed)


TWO_HOSTS = {**CPU, "hosts": ["node-a", "node-b"], "world_size": 2, "accumulate_grad_batches": 1}


def test_slow_rank_names_the_rank_its_host_and_what_the_others_lose() -> None:
    summary = {"train/step_ms": 100.0, "train/straggler_ms": 60.0, "train/slowest_rank": 1}
    verdict = slow_rank(run_with(summary, TWO_HOSTS))
    assert isinstance(verdict, Verdict)
    assert (verdict.name, verdict.severity) == ("slow rank", "high")
    assert verdict.value.startswith("the other ranks wait 60.0 ms per step for rank 1 on node-b (60% of")
    assert "its data loading does not explain it" in verdict.value
    assert "node-b" in verdict.next_step


def test_slow_rank_blames_data_loading_when_its_own_data_wait_covers_the_lead() -> None:
    summary = {
        "train/step_ms": 100.0,
        "train/straggler_ms": 60.0,
        "train/slowest_rank": 1,
        "train/dataloader_slowest_rank": 1,
        "train/dataloader_wait_ms_max": 61.0,  # rank 1; rank 0 waits 1 ms: the mean is 31
        "train/dataloader_wait_ms": 31.0,
    }
    verdict = slow_rank(run_with(summary, TWO_HOSTS))
    assert isinstance(verdict, Verdict)
    assert "its own data wait explains it (60.0 ms more per optimizer step than the others)" in verdict.value
    assert "input pipeline" in verdict.next_step


def test_slow_rank_is_per_optimizer_step_under_gradient_accumulation() -> None:
    summary = {"train/step_ms": 50.0, "train/straggler_ms": 30.0, "train/slowest_rank": 0}
    environment = {**TWO_HOSTS, "accumulate_grad_batches": 4}
    verdict = slow_rank(run_with(summary, environment))
    assert isinstance(verdict, Verdict)
    assert "30.0 ms per optimizer step" in verdict.value and "(15% of the 200.0 ms optimizer step)" in verdict.value
    assert verdict.severity == "medium"


def test_slow_rank_is_not_told_apart_from_the_profilers_start_up_when_most_steps_ran_beside_it() -> None:
    """A balanced 2-rank CPU job of 20 steps once read 12 %: its whole training ran beside rank 0's MLflow sender
    importing MLflow on the cores the ranks kept busy."""
    summary = {"train/step_ms": 8.6, "train/straggler_ms": 1.0, "train/slowest_rank": 0}

    def beside(overlap_s: float, measured_s: float) -> dict[str, Any]:
        return {"Throughput": {"data": {"train/startup_overlap_s": overlap_s, "train/measured_s": measured_s}}}

    outcome = slow_rank(run_with(summary, TWO_HOSTS, sections=beside(0.17, 0.17)))
    assert outcome == NotAssessed(
        "the other ranks waited 12% of a step for rank 0 on node-a, but 100% of the measured training ran beside "
        "the profiler's own start-up (its MLflow sender importing MLflow), which can cost a rank that much on busy "
        "cores: measure more steps, or build the callbacks before the model"
    )
    # a start-up that covered a few of many intervals leaves the typical one alone
    assert isinstance(slow_rank(run_with(summary, TWO_HOSTS, sections=beside(1.0, 60.0))), Verdict)
    # a rank the others wait for a third of each step is slow whatever ran beside it
    lead = {**summary, "train/straggler_ms": 3.0}
    assert isinstance(slow_rank(run_with(lead, TWO_HOSTS, sections=beside(0.17, 0.17))), Verdict)


def intervals(series: dict[str, list[float]], last: dict[str, float]) -> dict[str, Any]:
    """Per-interval metrics as a run folder has them (4 batches an interval), with end-of-run summaries: `last`,
    and the steady figures the callbacks make of the intervals (`reports.steady`)."""
    metrics = {
        key: {"step": [4 * (i + 1) for i in range(len(values))], "value": values, "time": [0.0] * len(values)}
        for key, values in series.items()
    }
    step_ms = series[names.TRAIN_STEP_MS]
    logged = [
        steady.Interval(4 * (i + 1), 4, 4 * ms / 1000, {key: values[i] for key, values in series.items()})
        for i, ms in enumerate(step_ms)
    ]
    last = {**{names.summary_of(k): v for k, v in steady.combined(steady.split(logged).steady).items()}, **last}
    return {**metrics, **{key: {"step": [20], "value": [value], "time": [0.0]} for key, value in last.items()}}


def test_slow_rank_is_not_told_apart_from_noise_when_the_step_time_itself_swings_more_than_the_wait() -> None:
    """Balanced ranks of a real 2-rank CPU job on a busy machine: the others waited 11 % of a step for rank 1 while
    the step time swung from 3.4 to 8.8 ms between log intervals."""
    noisy = intervals(
        {
            names.TRAIN_STEP_MS: [3.35, 5.80, 8.50, 3.51, 5.74],
            names.TRAIN_STRAGGLER_MS: [0.30, 0.50, 1.09, 0.61, 0.78],
        },
        {names.SUMMARY_TRAIN_SLOWEST_RANK: 1.0},
    )
    outcome = slow_rank(RunData(Path("run"), metrics=noisy, environment=TWO_HOSTS, hta={"metrics": {}}))
    assert isinstance(outcome, NotAssessed)
    assert outcome.reason.startswith("the other ranks waited 12% of a step for rank 1 on node-b, less than")
    assert "(2.2 ms): not told apart from noise" in outcome.reason
    # the same wait on a steady step time is a slow rank
    steady = intervals(
        {names.TRAIN_STEP_MS: [5.7, 5.8, 5.6, 5.7, 5.75], names.TRAIN_STRAGGLER_MS: [0.6, 0.62, 0.58, 0.61, 0.6]},
        {names.SUMMARY_TRAIN_SLOWEST_RANK: 1.0},
    )
    assert isinstance(
        slow_rank(RunData(Path("run"), metrics=steady, environment=TWO_HOSTS, hta={"metrics": {}})), Verdict
    )


def test_slow_rank_stays_quiet_for_balanced_ranks_and_says_why_it_could_not_look() -> None:
    assert slow_rank(run_with({"train/step_ms": 100.0, "train/straggler_ms": 4.0, "train/slowest_rank": 1})) is None
    assert slow_rank(run_with({"train/step_ms": 100.0})) == NotAssessed("one rank")
    reason = "the 2 ranks of each replica wait for each other inside their forward and backward collectives"
    ranks = {"Ranks": {"data": {"collective wait": f"not assessed: {reason}"}}}
    assert slow_rank(run_with({"train/step_ms": 100.0}, TWO_HOSTS, sections=ranks)) == NotAssessed(reason)


def test_a_failed_run_of_two_ranks_is_not_called_one_rank() -> None:
    """Only rank 0's report, no waits exchanged (the run ended early): says so, and the section does not read
    "rank balance (one rank)"."""
    outcome = slow_rank(run_with({"train/step_ms": 100.0}, TWO_HOSTS))
    assert outcome == NotAssessed("only rank 0 reported, the waits of the 2 ranks were never exchanged")
    note = render_section({"rank balance": outcome}).note
    assert "rank balance (one rank)" not in note and "rank balance (only rank 0 reported" in note


# ---- memory ----
def test_memory_near_the_limit_and_allocator_retries() -> None:
    near = memory_use(run_with({names.PEAK_ALLOCATED_MB: 120_000, names.PEAK_RESERVED_MB: 140_000}, H200))
    assert isinstance(near, Verdict)
    assert (near.name, near.severity) == ("memory near the limit", "medium")
    assert "peak reserved 140.0 GB of 150.0 GB (93%)" in near.value
    assert "checkpointing" in near.next_step
    retries = {"profiled_steps": {"totals": {"peak_allocated_mb": 90_000.0, "alloc_retries": 4, "ooms": 0}}}
    retried = memory_use(run_with({names.PEAK_ALLOCATED_MB: 90_000}, H200, memory_report=retries))
    assert isinstance(retried, Verdict)
    assert retried.severity == "high" and "4 allocation retries" in retried.value


def test_memory_headroom_suggests_a_larger_batch() -> None:
    verdict = memory_use(run_with({names.PEAK_ALLOCATED_MB: 20_000, names.PEAK_RESERVED_MB: 22_000}, H200))
    assert isinstance(verdict, Verdict)
    assert (verdict.name, verdict.severity) == ("memory headroom", "info")
    assert verdict.value == "peak allocated 20.0 GB of 150.0 GB (13%)"
    assert "up to about 6.8x" in verdict.next_step
    tiny = memory_use(run_with({names.PEAK_ALLOCATED_MB: 96.6}, H200))  # the demo model on an H200
    assert isinstance(tiny, Verdict)
    assert tiny.value == "peak allocated 97 MB of 150.0 GB (0%)" and "8x or more" in tiny.next_step


def test_memory_quiet_in_between_and_not_assessed_on_cpu() -> None:
    assert memory_use(run_with({names.PEAK_ALLOCATED_MB: 90_000, names.PEAK_RESERVED_MB: 100_000}, H200)) is None
    assert isinstance(memory_use(run_with({names.CPU_RSS_MB: 900.0})), NotAssessed)


# ---- MFU ----
def test_low_mfu_suggests_bf16_for_fp32_runs_and_fixes_otherwise() -> None:
    fp32 = low_mfu(run_with({"train/mfu": 0.05}, {**H200, "precision": "32-true"}))
    assert isinstance(fp32, Verdict)
    assert fp32.severity == "high" and fp32.value == "MFU 5% of the dense 32-true peak (below 30%)"
    assert "bf16-mixed" in fp32.next_step
    bf16 = low_mfu(run_with({"train/mfu": 0.2}, {**H200, "precision": "bf16-mixed"}))
    assert isinstance(bf16, Verdict)
    assert bf16.severity == "medium" and "torch.compile" in bf16.next_step
    assert low_mfu(run_with({"train/mfu": 0.45}, H200)) is None
    assert isinstance(low_mfu(run_with({})), NotAssessed)


# ---- together ----
def test_verdicts_come_most_severe_first() -> None:
    run = run_with(
        {"train/step_ms": 100.0, "train/dataloader_wait_ms": 20.0, "train/mfu": 0.05, names.PEAK_ALLOCATED_MB: 9e3},
        {**H200, "precision": "bf16-mixed"},
    )
    assert [(v.name, v.severity) for v in diagnose(run)] == [
        ("low MFU", "high"),
        ("dataloader-bound", "medium"),
        ("memory headroom", "info"),
    ]


def test_a_healthy_run_gets_no_verdict() -> None:
    run = run_with(
        {"train/step_ms": 100.0, "train/dataloader_wait_ms": 1.0, "train/mfu": 0.5, names.PEAK_ALLOCATED_MB: 1e5},
        H200,
        {**H200_SINGLE_GPU_HTA, names.hta_window("train/window_0", names.hta_rank(0, "idle_pct")): 3.0},
    )
    assert diagnose(run) == []


def test_odd_values_make_a_check_not_assessed_instead_of_raising() -> None:
    run = run_with({"train/step_ms": 100.0}, H200)
    run.metrics[names.SUMMARY_TRAIN_DATALOADER_WAIT_MS] = {"step": [1], "value": ["fast"], "time": [0]}
    outcomes = assess(run)
    assert isinstance(outcomes["dataloader wait"], NotAssessed)
    assert "could not assess" in outcomes["dataloader wait"].reason


def test_diagnosis_section_from_partial_or_broken_folders(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="not a run folder"):
        load_run(tmp_path)
    (tmp_path / "environment.json").write_text(json.dumps(CPU))
    (tmp_path / "metrics.json").write_text('{"summary/train/step_ms": {"step": [1], "val')  # cut short
    section = render_section(assess(load_run(tmp_path)))
    assert section is not None and section.title == "Diagnosis"
    assert section.rows == [["No limiter found (checked with data: none)."]]
    assert "dataloader wait (no training step times" in section.note


def test_diagnosis_section_lists_each_verdict_with_its_next_step(tmp_path: Path) -> None:
    metrics = {
        names.SUMMARY_TRAIN_STEP_MS: {"step": [8], "value": [40.0], "time": [0]},
        names.SUMMARY_TRAIN_DATALOADER_WAIT_MS: {"step": [8], "value": [30.0], "time": [0]},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    section = render_section(assess(load_run(tmp_path)))
    lines = [row[0] for row in section.rows]
    assert lines[0] == (
        "[high] dataloader-bound: 75% of training step time waits for data (30.0 of 40.0 ms per batch, steady state)"
    )
    assert lines[2].startswith("    Next: Raise the DataLoader's num_workers")
    assert section.data["verdicts"][0]["name"] == "dataloader-bound"


# ---- real fits ----
def fit_and_diagnose(tmp_path: Path, model: TinyRegressor, train: DataLoader) -> list[Verdict]:
    config = ProfilerConfig.load(
        None,
        [f"output_dir={tmp_path}", "tracking.enabled=false", "report.console=false", "system.enabled=false",
         "log_every_n_steps=6", "throughput.warmup_steps=2"],
    )  # fmt: skip
    trainer(build_callbacks(config), limit_val_batches=0).fit(model, train)
    return diagnose(load_run(run_folders(tmp_path)[0]))


def test_a_sleeping_dataloader_is_diagnosed_as_dataloader_bound(tmp_path: Path) -> None:
    verdicts = fit_and_diagnose(tmp_path, TinyRegressor(), DataLoader(SlowSamples(), batch_size=16))
    assert [v.name for v in verdicts] == ["dataloader-bound"]
    assert verdicts[0].severity == "high"


def test_a_compute_bound_fit_is_not_dataloader_bound(tmp_path: Path) -> None:
    train, _ = loaders(n_train=384)
    verdicts = fit_and_diagnose(tmp_path, TinyRegressor(step_sleep_s=0.04), train)  # 40 ms of "compute" per step
    assert "dataloader-bound" not in [v.name for v in verdicts]
