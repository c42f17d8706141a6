"""Every node's system samples, per node and per GPU, as two CSV tables in the run folder (`system_metrics/`).

MLflow gets the cluster's view (`reports.cluster_view`), whose points do not grow with the job; the detail goes
here: `nodes.csv` has a row per node and sample (CPU, memory, disk, network, CPU energy), `gpus.csv` a row per GPU
and sample. Rank 0 appends the rows as the samples reach it, so its memory stays flat over any run length and a run
cut short keeps what came before. A notebook reads them with `pandas.read_csv`; `read_system_table` reads them
without pandas, `read_node_means` streams them into each node's and GPU's means (the report's and `compare`'s view).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from anemoi_profiler import names
from anemoi_profiler.run_files.layout import SYSTEM_GPUS_FILE, SYSTEM_METRICS_DIR, SYSTEM_NODES_FILE

NODE_COLUMNS = ("node", "host", "step", "time", *names.NODE_LEAVES)
GPU_COLUMNS = ("node", "host", "gpu", "step", "time", *names.GPU_LEAVES)
_GPU_KEY = re.compile(r"^gpu_(?P<ordinal>\d+)_(?P<leaf>.+)$")


@dataclass
class NodeSample:
    """One system sample of one node: its figures by MLflow's leaf names, its GPUs' by ordinal."""

    node: int
    step: int
    time: float
    values: dict[str, float] = field(default_factory=dict)
    gpus: dict[int, dict[str, float]] = field(default_factory=dict)
    host: str = ""

    @classmethod
    def of_metrics(cls, node: int, step: int, time: float, metrics: Mapping[str, float]) -> NodeSample:
        """From the sampler's `system/<leaf>` and `system/gpu_<i>_<leaf>` figures; other names are left out."""
        sample = cls(node, step, time)
        for key, value in metrics.items():
            leaf = key.rsplit("/", 1)[-1]
            match = _GPU_KEY.match(leaf)
            if match and match["leaf"] in names.GPU_LEAVES:
                sample.gpus.setdefault(int(match["ordinal"]), {})[match["leaf"]] = value
            elif leaf in names.NODE_LEAVES:
                sample.values[leaf] = value
        return sample

    def metrics(self, node_id: str | None = None) -> dict[str, float]:
        """The sample under MLflow's names: `system/<leaf>`, or `system/<node_id>/<leaf>`."""
        metrics = {names.system(leaf, node_id): value for leaf, value in self.values.items()}
        for ordinal, values in self.gpus.items():
            metrics.update({names.system(f"gpu_{ordinal}_{leaf}", node_id): value for leaf, value in values.items()})
        return metrics


class SystemTableWriter:
    """Appends samples to `system_metrics/nodes.csv` and `gpus.csv` (the header with the first rows)."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = Path(run_dir) / SYSTEM_METRICS_DIR

    def append(self, samples: Iterable[NodeSample]) -> None:
        nodes, gpus = [], []
        for sample in samples:
            where = [sample.node, sample.host]
            when = [sample.step, f"{sample.time:.3f}"]
            nodes.append([*where, *when, *(_cell(sample.values.get(leaf)) for leaf in names.NODE_LEAVES)])
            for ordinal, values in sorted(sample.gpus.items()):
                gpus.append([*where, ordinal, *when, *(_cell(values.get(leaf)) for leaf in names.GPU_LEAVES)])
        self.folder.mkdir(parents=True, exist_ok=True)
        _append_rows(self.folder / SYSTEM_NODES_FILE, NODE_COLUMNS, nodes)
        _append_rows(self.folder / SYSTEM_GPUS_FILE, GPU_COLUMNS, gpus)


def _cell(value: float | None) -> str:
    """Thousandths of the unit (kB, mW, mJ, 0.001 %): finer than the sources measure, a third shorter than repr."""
    return "" if value is None or math.isnan(value) else repr(round(float(value), 3))


def _append_rows(path: Path, columns: tuple[str, ...], rows: list[list[object]]) -> None:
    if not rows:
        return
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        if new:
            writer.writerow(columns)
        writer.writerows(rows)


class NodeMeans:
    """Each node's and each GPU's mean of every figure over the samples added: memory by nodes and GPUs, not by
    samples, so rank 0 keeps them over any run length."""

    def __init__(self) -> None:
        self._sums: dict[tuple[int, int, str], list[float]] = {}  # (node, GPU or -1, leaf): [sum, count]
        self._hosts: dict[int, str] = {}

    def add(self, sample: NodeSample) -> None:
        self._hosts[sample.node] = sample.host
        for leaf, value in sample.values.items():
            self._add((sample.node, -1, leaf), value)
        for ordinal, values in sample.gpus.items():
            for leaf, value in values.items():
                self._add((sample.node, ordinal, leaf), value)

    def _add(self, key: tuple[int, int, str], value: float) -> None:
        total = self._sums.setdefault(key, [0.0, 0.0])
        total[0] += value
        total[1] += 1

    def means(self) -> list[NodeSample]:
        """One `NodeSample` per node holding its means (step -1)."""
        nodes = {node: NodeSample(node, -1, 0.0, host=host) for node, host in sorted(self._hosts.items())}
        for (node, ordinal, leaf), (total, count) in self._sums.items():
            target = nodes[node].values if ordinal < 0 else nodes[node].gpus.setdefault(ordinal, {})
            target[leaf] = total / count
        return list(nodes.values())


def read_node_means(run_dir: Path) -> list[NodeSample]:
    """Each node's and GPU's means from the run folder's tables, read row by row; [] without them."""
    means = NodeMeans()
    for sample in _stream_samples(Path(run_dir) / SYSTEM_METRICS_DIR):
        means.add(sample)
    return means.means()


def _stream_samples(folder: Path) -> Iterable[NodeSample]:
    for name, gpu in ((SYSTEM_NODES_FILE, False), (SYSTEM_GPUS_FILE, True)):
        try:
            with (folder / name).open(newline="", encoding="utf-8") as file:
                for row in csv.DictReader(file):
                    if None in row.values():
                        continue  # a row cut short
                    leaves = names.GPU_LEAVES if gpu else names.NODE_LEAVES
                    values = {leaf: float(row[leaf]) for leaf in leaves if row.get(leaf)}
                    sample = NodeSample(int(row["node"]), int(row["step"]), float(row["time"]), host=row["host"])
                    if gpu:
                        sample.gpus[int(row["gpu"])] = values
                    else:
                        sample.values = values
                    yield sample
        except OSError:
            continue


def read_system_table(run_dir: Path) -> tuple[dict[str, list[object]], dict[str, list[object]]]:
    """(nodes, gpus): each table as columns (`node`, `host`, `step`, ... then the figures, None where a sample had
    none); empty tables for a run folder without them. A last row cut short by a killed run is left out."""
    folder = Path(run_dir) / SYSTEM_METRICS_DIR
    return _read_columns(folder / SYSTEM_NODES_FILE, NODE_COLUMNS), _read_columns(
        folder / SYSTEM_GPUS_FILE, GPU_COLUMNS
    )


def _read_columns(path: Path, columns: tuple[str, ...]) -> dict[str, list[object]]:
    table: dict[str, list[object]] = {column: [] for column in columns}
    try:
        with path.open(newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
    except OSError:
        return table
    for row in rows:
        if None in row.values():
            continue  # a row cut short
        for column in columns:
            table[column].append(_parse(column, row.get(column, "")))
    return table


def _parse(column: str, text: str) -> object:
    if column == "host":
        return text
    if column in ("node", "gpu", "step"):
        return int(text)
    return float(text) if text else None
