"""The MLflow metric names the profiler writes and reads (docs/metrics.md): writers, readers and tests import
them from here, so that a name is spelled once. Names of files in the run folder live in `run_files/layout.py`.

Fixed names are constants; names with a stage, rank, node or window in them come from the functions below.
`system/...` names are MLflow's own (its System metrics tab shows them); their leaves are MLflow's too.
"""

from __future__ import annotations

THROUGHPUT = "throughput/"
TIME = "time/"
MEMORY = "memory/"
SYSTEM = "system/"
SUMMARY = "summary/"
HTA = "hta/"
WINDOW = "window/"


def window_spread(stage: str, field: str, statistic: str) -> str:
    """`window/<stage>/<field>_<statistic>`: a window summary field across ranks (min, median, max, argmax_rank)."""
    return f"{WINDOW}{stage}/{field}_{statistic}"


def window_end_held(stage: str) -> str:
    """`window/<stage>/end_held_ms`: how long a window's end held rank 0's training thread (torch's stop, the
    trace export, handing the window over), at the step after the window's last batch."""
    return f"{WINDOW}{stage}/end_held_ms"


def all_in(metric: str) -> str:
    """The end-of-run rate over every batch after the warmup and every second of it (profiling windows, slow
    stretches, the profiler's own work and epoch starts in): `throughput/train/samples_per_sec` ->
    `summary/train/samples_per_sec_all_in`."""
    return summary_of(metric) + "_all_in"


def with_epoch_starts(metric: str) -> str:
    """The all-in rate's older name, written beside it when an epoch start was measured:
    `throughput/train/samples_per_sec` -> `summary/train/samples_per_sec_with_epoch_starts`."""
    return summary_of(metric) + "_with_epoch_starts"


def slow_stretch(stage: str, name: str) -> str:
    """`summary/<stage>/slow_stretch_<name>`: the log intervals that the steady figures set apart (`reports.steady`):
    `s`, `share` (of the stage's measured time), `samples_per_sec`."""
    return summary(f"{stage}/slow_stretch_{name}")


def throughput(stage: str, name: str) -> str:
    """`throughput/<stage>/<name>`: global rates (`device/<name>` for this rank's device)."""
    return f"{THROUGHPUT}{stage}/{name}"


def timing(stage: str, name: str) -> str:
    """`time/<stage>/<name>`: where a batch's time goes."""
    return f"{TIME}{stage}/{name}"


def memory(name: str) -> str:
    return f"{MEMORY}{name}"


def summary(name: str) -> str:
    """`summary/<name>`: an end-of-run value."""
    return f"{SUMMARY}{name}"


def summary_of(metric: str) -> str:
    """The end-of-run name of a per-interval metric: `time/train/step_ms` -> `summary/train/step_ms`,
    `throughput/train/mfu` -> `summary/train/mfu`; memory keeps its part: `summary/memory/cpu_rss_mb`."""
    return summary(metric if metric.startswith(MEMORY) else metric.split("/", 1)[1])


def system(name: str, node_id: str | None = None) -> str:
    """`system/<name>`, or MLflow's node form `system/<node_id>/<name>` (`system/node_<k>/...` with
    `system.per_node_series`, `system/cluster/...` for the cluster view)."""
    return f"{SYSTEM}{node_id}/{name}" if node_id else f"{SYSTEM}{name}"


def gpu(ordinal: int, name: str) -> str:
    """`system/gpu_<i>_<name>`, MLflow's name for GPU `i`'s figures."""
    return system(f"gpu_{ordinal}_{name}")


NODE_LEAVES = (
    "cpu_utilization_percentage",
    "system_memory_usage_megabytes",
    "system_memory_usage_percentage",
    "disk_usage_percentage",
    "disk_usage_megabytes",
    "disk_available_megabytes",
    "network_receive_megabytes",
    "network_transmit_megabytes",
    "cpu_energy_joules",
)
"""The system sampler's figures of a whole node, by MLflow's names (`system/<leaf>`)."""
GPU_LEAVES = (
    "utilization_percentage",
    "memory_usage_megabytes",
    "memory_usage_percentage",
    "power_usage_watts",
    "power_usage_percentage",
    "temperature_celsius",
    "energy_joules",
)
"""The system sampler's figures of one GPU, by MLflow's names without the GPU (`system/gpu_<i>_<leaf>`)."""
CLUSTER_STATISTICS = ("min", "median", "max", "outlier_node")
"""What the cluster view gives of each figure; a GPU figure also names the outlier's GPU (`outlier_gpu`)."""


def cluster(leaf: str, statistic: str) -> str:
    """`system/cluster/<leaf>_<statistic>`: a node figure (`cpu_utilization_percentage`) or a GPU figure
    (`gpu_utilization_percentage`) across the job's nodes or GPUs; `statistic` is one of `CLUSTER_STATISTICS`
    or `outlier_gpu`."""
    return system(f"{leaf}_{statistic}", "cluster")


def hta_rank(rank: int, name: str) -> str:
    return f"{HTA}rank{rank}/{name}"


def hta_all_ranks(name: str) -> str:
    return f"{HTA}all_ranks/{name}"


def hta_window(window: str, metric: str) -> str:
    """An HTA metric of one profiling window: `hta/rank0/idle_pct` -> `hta/<stage>/window_<k>/rank0/idle_pct`."""
    return f"{HTA}{window}/{metric.removeprefix(HTA)}"


def profiler_summary(name: str) -> str:
    """`summary/profiler/<name>`: the profiling windows' end-of-run figures."""
    return summary(f"profiler/{name}")


def component_summary(name: str) -> str:
    """`summary/component/<name>`: one module's calls profiled outside a Trainer."""
    return summary(f"component/{name}")


TRAIN_SAMPLES_PER_SEC = throughput("train", "samples_per_sec")
TRAIN_BATCHES_PER_SEC = throughput("train", "batches_per_sec")
TRAIN_ITEMS_PER_SEC = throughput("train", "items_per_sec")
TRAIN_DEVICE_SAMPLES_PER_SEC = throughput("train", "device/samples_per_sec")
TRAIN_MFU = throughput("train", "mfu")
TRAIN_SLOWEST_RANK = throughput("train", "slowest_rank")
VAL_SAMPLES_PER_SEC = throughput("val", "samples_per_sec")

TRAIN_STEP_MS = timing("train", "step_ms")
TRAIN_STEP_MS_MIN = timing("train", "step_ms_min")
TRAIN_STEP_MS_MAX = timing("train", "step_ms_max")
TRAIN_DATALOADER_WAIT_MS = timing("train", "dataloader_wait_ms")
TRAIN_DATALOADER_WAIT_MS_MAX = timing("train", "dataloader_wait_ms_max")
TRAIN_DATALOADER_SLOWEST_RANK = timing("train", "dataloader_slowest_rank")
TRAIN_CALLBACKS_MS = timing("train", "callbacks_ms")
TRAIN_LOOP_MS = timing("train", "loop_ms")
TRAIN_COLLECTIVE_WAIT_MS = timing("train", "collective_wait_ms")
TRAIN_COLLECTIVE_WAIT_MS_MIN = timing("train", "collective_wait_ms_min")
TRAIN_COLLECTIVE_WAIT_MS_MAX = timing("train", "collective_wait_ms_max")
TRAIN_STRAGGLER_MS = timing("train", "straggler_ms")
VAL_STEP_MS = timing("val", "step_ms")
VAL_DATALOADER_WAIT_MS = timing("val", "dataloader_wait_ms")
VAL_CALLBACKS_MS = timing("val", "callbacks_ms")
VAL_LOOP_MS = timing("val", "loop_ms")

PEAK_ALLOCATED_MB = memory("peak_allocated_mb")
PEAK_RESERVED_MB = memory("peak_reserved_mb")
CPU_RSS_MB = memory("cpu_rss_mb")

SUMMARY_TRAIN_SAMPLES_PER_SEC = summary_of(TRAIN_SAMPLES_PER_SEC)
SUMMARY_TRAIN_BATCHES_PER_SEC = summary_of(TRAIN_BATCHES_PER_SEC)
SUMMARY_TRAIN_SAMPLES_PER_SEC_ALL_IN = all_in(TRAIN_SAMPLES_PER_SEC)
SUMMARY_TRAIN_BATCHES_PER_SEC_ALL_IN = all_in(TRAIN_BATCHES_PER_SEC)
SUMMARY_VAL_SAMPLES_PER_SEC = summary_of(VAL_SAMPLES_PER_SEC)
SUMMARY_TRAIN_SLOWEST_RANK = summary_of(TRAIN_SLOWEST_RANK)
SUMMARY_TRAIN_STEP_MS = summary_of(TRAIN_STEP_MS)
SUMMARY_TRAIN_STEP_MS_MIN = summary_of(TRAIN_STEP_MS_MIN)
SUMMARY_TRAIN_STEP_MS_MAX = summary_of(TRAIN_STEP_MS_MAX)
SUMMARY_TRAIN_DATALOADER_WAIT_MS = summary_of(TRAIN_DATALOADER_WAIT_MS)
SUMMARY_TRAIN_DATALOADER_SLOWEST_RANK = summary_of(TRAIN_DATALOADER_SLOWEST_RANK)
SUMMARY_TRAIN_STARTUP_OVERLAP_S = summary("train/startup_overlap_s")
SUMMARY_TRAIN_EPOCH_STARTS = summary("train/epoch_starts")
SUMMARY_TRAIN_EPOCH_START_S = summary("train/epoch_start_s")
SUMMARY_TRAIN_EPOCH_START_SHARE = summary("train/epoch_start_share")
SUMMARY_PEAK_ALLOCATED_MB = summary_of(PEAK_ALLOCATED_MB)
SUMMARY_PEAK_RESERVED_MB = summary_of(PEAK_RESERVED_MB)
SUMMARY_SNAPSHOT_MB = summary("memory/snapshot_mb")
SUMMARY_SNAPSHOT_DUMP_S = summary("memory/snapshot_dump_s")
SUMMARY_GPU_KWH = summary("energy/gpu_kwh")
SUMMARY_CPU_KWH = summary("energy/cpu_kwh")
SUMMARY_JOULES_PER_SAMPLE = summary("energy/joules_per_sample")

CPU_UTILIZATION = system("cpu_utilization_percentage")
