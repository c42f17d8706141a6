"""The cluster's view of the nodes' system samples: per figure, the min, median and max across the job's nodes (or
GPUs) and the outlier, the node (and GPU) farthest from the median. What MLflow gets under `system/cluster/...`:
a fixed number of series whatever the number of nodes and GPUs."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median

from .. import names
from .system_table import NodeSample

NOT_AN_OUTLIER = -1.0
"""The outlier's node or GPU when every value equals the median (one node, or all alike)."""


def cluster_view(samples: Iterable[NodeSample]) -> dict[str, float]:
    """`system/cluster/<leaf>_{min,median,max,outlier_node}` for each node figure some node has, and the same with
    `gpu_<leaf>` and `outlier_gpu` (the GPU's ordinal on its node) for each GPU figure, across all the GPUs."""
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
    outlier = (float(-node), float(-ordinal)) if distance > 0 else (NOT_AN_OUTLIER, NOT_AN_OUTLIER)
    spread = {
        names.cluster(leaf, "min"): min(values),
        names.cluster(leaf, "median"): middle,
        names.cluster(leaf, "max"): max(values),
        names.cluster(leaf, "outlier_node"): outlier[0],
    }
    if gpu:
        spread[names.cluster(leaf, "outlier_gpu")] = outlier[1]
    return spread
