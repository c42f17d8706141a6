"""The sections of the configuration tree, one dataclass each, every field with the help text that
docs/configuration.md and `anemoi-profiler config` show. `config.ProfilerConfig` puts them together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ITEM_COUNTING = ("replica", "rank")


def _opt(default: Any, help: str | None) -> Any:
    """A config field with its help text (a section's is its class docstring); docs/configuration.md is generated
    from these."""
    if isinstance(default, type) or callable(default):
        return field(default_factory=default, metadata={"help": help or ""})
    return field(default=default, metadata={"help": help or ""})


@dataclass
class TrackingConfig:
    """Where metrics and artifacts go."""

    enabled: bool = _opt(True, "Send metrics, params and artifacts to MLflow (the run folder is written either way).")
    uri: str | None = _opt(
        None,
        "MLflow tracking URI. null: the trainer's MLFlowLogger, else $MLFLOW_TRACKING_URI, else "
        "sqlite:///<output_dir>/mlflow.db.",
    )
    experiment: str = _opt("anemoi-profiler", "Experiment of the run the profiler opens when there is no MLFlowLogger.")
    run_name: str | None = _opt(None, "Name of that run; null: the run folder's name.")
    flush_interval_s: float = _opt(
        5.0, "Seconds between sends to MLflow (from a child process); the training thread never waits for them."
    )
    retry_interval_s: float = _opt(30.0, "Seconds between retries while MLflow does not answer.")
    close_timeout_s: float = _opt(
        30.0, "Longest wait for MLflow at the end of the run; what is left stays in <run folder>/spool/."
    )
    upload_artifacts: bool = _opt(True, "Upload the run folder to the MLflow run under profiler/.")


@dataclass
class ThroughputConfig:
    """Samples, batches and items per second and MFU, measured without a device sync per step."""

    enabled: bool = _opt(True, "Log throughput/{train,val}/... and summary/... rates.")
    warmup_steps: int = _opt(5, "First training batches not measured (compilation, allocator and cache warmup).")
    length_fn: str | None = _opt(
        None, "'package.module:function' giving the items (tokens, grid points) in a batch, for items_per_sec."
    )
    batch_size_fn: str | None = _opt(
        None, "'package.module:function' giving the samples in a batch; null: dim 0 of the first tensor found."
    )
    flops_per_sample: float | None = _opt(
        None, "Forward+backward FLOPs of one sample; null: measured once on a real batch when the peak is known."
    )
    measure_flops: bool = _opt(True, "Measure FLOPs per sample with torch's FlopCounterMode on the first batch.")
    device_peak_flops: float | None = _opt(
        None,
        "Dense peak FLOP/s of one device; null: looked up for the precision (NVIDIA V100 to B200, AMD MI210, MI250X "
        "and MI250 per GCD, MI300X, MI300A; docs/metrics.md).",
    )


@dataclass
class TimingConfig:
    """Step time, dataloader wait and peak memory per log interval."""

    enabled: bool = _opt(True, "Log time/... and memory/... per log interval.")


@dataclass
class SystemConfig:
    """CPU, memory, disk, network, per-GPU metrics and energy from a background thread, under MLflow's names."""

    enabled: bool = _opt(True, "Sample system metrics (one sampler per node, on local rank 0).")
    interval_s: float = _opt(10.0, "Seconds between samples; one more is taken at the start and at the end.")
    gpus: bool = _opt(
        True,
        "Include this job's GPUs, with their energy: NVIDIA through NVML (the gpu extra: nvidia-ml-py), AMD through "
        "amdsmi (the package of your ROCm).",
    )
    disk_path: str = _opt("/", "Filesystem whose usage is reported.")
    per_node_series: bool = _opt(
        False,
        "On several nodes, also log each node's samples to MLflow as `system/node_<k>/...` (points that grow with the "
        "nodes); the run folder's `system_metrics/` has them either way.",
    )


@dataclass
class WindowConfig:
    """A torch.profiler schedule: skip `skip_first` batches, then `repeat` cycles of wait, warmup, active."""

    skip_first: int = _opt(10, "Batches skipped before the first cycle.")
    wait: int = _opt(5, "Batches idle at the start of each cycle.")
    warmup: int = _opt(2, "Batches traced but discarded before the active ones.")
    active: int = _opt(3, "Batches recorded per window.")
    repeat: int = _opt(
        1, "Number of windows; 0 repeats until the stage ends (operator tables: a rank's first 8 windows)."
    )


@dataclass
class TorchProfilerConfig:
    """Profiling windows with torch.profiler: traces, time report, memory report."""

    enabled: bool = _opt(False, "Run torch.profiler windows.")
    train: WindowConfig = _opt(WindowConfig, "Training schedule, counted in training batches.")
    validation: bool = _opt(True, "Also profile validation (never the sanity check).")
    val: WindowConfig = _opt(
        lambda: WindowConfig(skip_first=0, wait=0, warmup=1, active=2, repeat=1),
        "Validation schedule, counted in batches of each validation run.",
    )
    record_shapes: bool = _opt(True, "Record input shapes of operators.")
    profile_memory: bool = _opt(True, "Record allocations per operator (the memory report needs it).")
    with_stack: bool = _opt(False, "Record Python stacks (large traces).")
    with_flops: bool = _opt(False, "Estimate FLOPs of matmuls and convolutions.")
    with_modules: bool = _opt(False, "Record the nn.Module hierarchy of operators.")
    sync_events: bool = _opt(True, "Record CUDA synchronization events, which HTA's critical-path analysis needs.")
    traces: Any = _opt(
        True,
        "Write Chrome traces (traces/<stage>/window_<k>/rank<r>.pt.trace.json.gz): true, false, or 'flagged': "
        "rank 0 and the ranks whose window summary stands out keep theirs, the others only their summary.",
    )
    flag_distance_pct: float = _opt(
        10.0,
        "With traces: flagged, a rank also keeps its trace when its idle_pct, exposed_communication_pct or "
        "host_collective_pct is more than this many points from the ranks' median.",
    )
    trace_budget_mb: float = _opt(
        300.0, "Warn before a window whose uncompressed trace would exceed this; above 4x it is not written."
    )
    upload_traces_max_mb: float = _opt(
        200.0, "Upload traces to MLflow only while their total stays below this; the run folder keeps them all."
    )
    window_summary: bool = _opt(
        True,
        "Summarise every window on every rank in process (device idle and why, overlap, top kernels; docs/hta.md): "
        "window_summaries/<stage>/window_<k>/window_summary.{csv,json} and window/... metrics.",
    )
    time_report: bool = _opt(True, "Write time_report.{csv,json}: top operators by CPU and device time.")
    memory_report: bool = _opt(True, "Write memory_report.{txt,csv,json}: allocations per operator, explained.")
    memory_timeline: bool = _opt(
        False, "Write memory/timeline_rank<r>.html with export_memory_timeline (CUDA only; slow on long windows)."
    )
    top_n: int = _opt(30, "Operators per table.")


@dataclass
class MemorySnapshotConfig:
    """CUDA caching-allocator snapshot (open at pytorch.org/memory_viz); also dumped when the run dies."""

    enabled: bool = _opt(False, "Record allocation history and dump memory/snapshot_rank<r>.pickle (CUDA only).")
    start_step: int = _opt(5, "Training batch at which recording starts.")
    steps: int = _opt(3, "Batches recorded.")
    max_entries: int = _opt(100000, "Allocation events kept in the history.")
    on_exception: bool = _opt(True, "Also dump a snapshot when the run dies (out of memory or any exception).")


@dataclass
class ModelSummaryConfig:
    """torchinfo summary of the model on a real batch (rank 0)."""

    enabled: bool = _opt(False, "Write model_summary.txt and model/... params.")
    depth: int = _opt(3, "Module nesting depth shown.")


@dataclass
class HtaConfig:
    """Holistic Trace Analysis over the run's traces after fit (rank 0; needs the hta extra)."""

    enabled: bool = _opt(False, "Analyse every trace window after fit; results in hta/ and hta/... metrics.")
    time_limit_s: float = _opt(300.0, "Seconds for all analyses together; what is left is skipped and said so.")
    memory_limit_mb: float = _opt(
        8000.0, "Resident memory of the HTA process (MB) above which it is stopped and the rest skipped, said so."
    )


@dataclass
class DistributedConfig:
    """Multi-process runs (DDP, FSDP; Lightning's launcher, torchrun, SLURM)."""

    profiled_ranks: Any = _opt(
        "auto",
        "Global ranks that run torch.profiler windows: 'auto' (every rank up to 8 ranks; beyond, at most 16: "
        "rank 0's node, the last rank and the first ranks of nodes spread over the job), 'all', or a list "
        "such as [0, 1].",
    )
    timeout_s: float = _opt(
        120.0, "Timeout of the profiler's own collectives; a dead rank never freezes the others in profiler code."
    )
    data_parallel_size: Any = _opt(
        "auto",
        "Data-parallel replicas, whose samples global rates count once each: 'auto' (the strategy's sampler "
        "replicas, anemoi's model groups, else the world size) or an integer dividing the world size.",
    )
    item_counting: str = _opt(
        "replica",
        "How global items/s count length_fn's items: 'replica' (every rank of a replica holds the same items, "
        "as under tensor parallelism: once per replica) or 'rank' (each rank holds its own slice, as anemoi's "
        "sharded grids: summed over ranks).",
    )
    straggler: bool = _opt(
        True,
        "Time each rank's wait for the gradient all-reduce (a DDP communication hook doing the same all-reduce) "
        "to name the rank the others wait for.",
    )


@dataclass
class TriggersConfig:
    """Profiling windows that open themselves when training changes (docs/profiling.md, Triggered windows)."""

    enabled: bool = _opt(False, "Watch the training log intervals and open a profiling window when a trigger fires.")
    drift: bool = _opt(True, "Trigger on a sustained rise of the step time (reason 'drift').")
    slow_rank: bool = _opt(
        True,
        "Trigger when one rank becomes the one the others wait for (reason 'slow-rank'; needs distributed.straggler).",
    )
    memory: bool = _opt(True, "Trigger when a rank's peak memory rises interval after interval (reason 'memory').")
    warmup_intervals: int = _opt(
        2, "Log intervals after throughput.warmup_steps that no baseline uses and no memory climb counts."
    )
    baseline_intervals: int = _opt(
        20, "Recent in-control log intervals a baseline (median and MAD) keeps; 5 are needed before a trigger fires."
    )
    confirm_intervals: int = _opt(2, "Consecutive log intervals beyond the threshold before drift or slow-rank fires.")
    sigmas: float = _opt(3.5, "Threshold in baseline spreads (1.4826 x MAD) beyond the baseline median.")
    min_slowdown: float = _opt(0.05, "Drift: smallest relative slowdown of each confirming interval (0.05 = 5 %).")
    min_lag: float = _opt(
        0.10, "Slow rank: smallest lag of the awaited rank beyond its baseline, as a share of the step time."
    )
    memory_intervals: int = _opt(5, "Memory: consecutive log intervals in which a rank's peak memory rises.")
    min_memory_growth: float = _opt(0.05, "Memory: smallest growth over those intervals (0.05 = 5 %).")
    steps: int = _opt(3, "Batches recorded per triggered window.")
    profiler_warmup: int = _opt(1, "Batches traced but discarded before them.")
    cooldown_steps: int = _opt(500, "Training steps after a triggered window before the next may open.")
    max_windows: int = _opt(3, "Triggered windows per run at most (requested windows do not count).")
    requests: bool = _opt(
        True,
        "Serve windows asked for with `anemoi-profiler request`: rank 0 polls the run folder, its MLflow sender the "
        "run's profiler.request tag.",
    )
    request_poll_s: float = _opt(5.0, "Seconds between rank 0's looks for a request file (off the training thread).")


@dataclass
class PostmortemConfig:
    """What a run that stalls, runs out of memory or is stopped leaves in postmortem/ (docs/postmortem.md)."""

    enabled: bool = _opt(
        True, "Watch for stalls, record out-of-memory errors and SIGTERM/SIGUSR1 (nothing runs per step)."
    )
    stall_after_s: Any = _opt(
        "auto",
        "Seconds without a finished batch before a rank records a stall: 'auto' (the larger of 300 s and 100 "
        "median steps, so a checkpoint or a validation pass is no stall) or a number > 0.",
    )
    memory_history: bool = _opt(
        False,
        "CUDA: record allocations (torch.cuda.memory._record_memory_history) so that an out-of-memory error "
        "leaves a snapshot with the allocation sites; its cost is not yet assessed on a GPU, hence off.",
    )
    memory_history_entries: int = _opt(100000, "Allocations the memory history keeps (a ring buffer).")
    signals: bool = _opt(
        True, "On SIGTERM and SIGUSR1: record the stacks and the step, then the handler that was there runs."
    )
    flight_recorder: bool = _opt(
        True,
        "NCCL: turn on torch's Flight Recorder (unless TORCH_NCCL_TRACE_BUFFER_SIZE is set) and dump it into "
        "postmortem/flight_recorder/.",
    )


@dataclass
class ReportConfig:
    """The end-of-run report: which renderings to make."""

    console: bool = _opt(True, "Print the report at the end of the run.")
    txt: bool = _opt(True, "Write report.txt.")
    json: bool = _opt(True, "Write report.json.")
    html: bool = _opt(True, "Write report.html (self-contained, plots inline) and plots/*.svg.")
