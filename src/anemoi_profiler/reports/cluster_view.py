"""The cluster's view of the nodes' system samples: per figure, the min, median and max across the job's nodes (or
GPUs) and the outlier, the node (and GPU) farthest from the median. What MLflow gets under `system/cluster/...`
from two nodes on: a fixed number of series whatever the number of nodes and GPUs."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median

from anemoi_profiler import names
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.run_files.layout import SYSTEM_METRICS_DIR
from anemoi_profiler.run_files.system_tables import NodeSample


def cluster_view(samples: Iterable[NodeSample]) -> dict[str, float]:
    """`system/cluster/<leaf>_{min,median,max,outlier_node}` for each node figure some node has, and the same with
    `gpu_<leaf>` and `outlier_gpu` (the GPU's ordinal on its node) for each GPU figure, across all the GPUs. The
    outlier only where some value differs from the median: when all are alike there is none to name."""
    node_figures: dict[str, list[tuple[float, int, int]]] = {}
    gpu_figures: dict[str, list[tuple[float, int, int]]] = {}
    for sample in sorted(samples, key=lambda sample: sample.node):
        for leaf, value in sample.values.items():
            node_figures.setdefault(leaf, []).append((value, sample.node, -1))
        for ordinal, values in sorted(sample.gpus.items()):
            for leaf, value in values.items():
                gpu_figures.setdefault(leaf, []).append((value, sample.node, ordinal))
    metrics: dict[str, float] = {}
    for leaf, entries in node_figures.items():
        metrics.update(_spread(leaf, entries, gpu=False))
    for leaf, entries in gpu_figures.items():
        metrics.update(_spread(f"gpu_{leaf}", entries, gpu=True))
    return metrics


def _spread(leaf: str, entries: list[tuple[float, int, int]], gpu: bool) -> dict[str, float]:
    values = [value for value, _, _ in entries]
    middle = median(values)
    distance, node, ordinal = max((abs(value - middle), -node, -ordinal) for value, node, ordinal in entries)
    spread = {
        names.cluster(leaf, "min"): min(values),
        names.cluster(leaf, "median"): middle,
        names.cluster(leaf, "max"): max(values),
    }
    if distance > 0:
        spread[names.cluster(leaf, "outlier_node")] = float(-node)
        if gpu:
            spread[names.cluster(leaf, "outlier_gpu")] = float(-ordinal)
    return spread


SECTION_FIGURES = (
    ("cpu_utilization_percentage", "CPU utilisation", "%"),
    ("system_memory_usage_percentage", "memory used", "%"),
    ("gpu_utilization_percentage", "GPU utilisation", "%"),
    ("gpu_memory_usage_percentage", "GPU memory used", "%"),
    ("gpu_power_usage_watts", "GPU power", "W"),
    ("gpu_temperature_celsius", "GPU temperature", "C"),
)
"""The figures of the report's view across nodes: what tells a node or GPU apart."""


def nodes_section(means: list[NodeSample]) -> ReportSection | None:
    """The report's view across the job's nodes and GPUs, from each one's means over the run; None on one node
    with at most one GPU (nothing to set apart)."""
    if len(means) < 2 and sum(len(sample.gpus) for sample in means) < 2:
        return None
    view, hosts = cluster_view(means), {sample.node: sample.host for sample in means}
    rows, data = [], {}
    for leaf, label, unit in SECTION_FIGURES:
        if names.cluster(leaf, "median") not in view:
            continue
        low, middle, high = (view[names.cluster(leaf, statistic)] for statistic in ("min", "median", "max"))
        node = view.get(names.cluster(leaf, "outlier_node"))
        outlier = ""
        if node is not None:
            outlier = f"node {int(node)}" + (f" ({hosts[int(node)]})" if hosts.get(int(node)) else "")
            if leaf.startswith("gpu_"):
                outlier += f", GPU {int(view[names.cluster(leaf, 'outlier_gpu')])}"
        rows.append([f"{label} ({unit})", f"{low:.1f}", f"{middle:.1f}", f"{high:.1f}", outlier])
        data[leaf] = {"min": low, "median": middle, "max": high, "outlier": outlier}
    columns = ["mean over the run", "min", "median", "max", "farthest from the median"]
    note = (
        f"{len(means)} node(s), {sum(len(sample.gpus) for sample in means)} GPU(s); every sample of every node and "
        f"GPU: {SYSTEM_METRICS_DIR}/nodes.csv and gpus.csv."
    )
    return ReportSection("System across nodes", columns, rows, data, note)
