"""How each node's system samples reach rank 0, and what rank 0 makes of them: the cluster's view in MLflow, the
per-node, per-GPU detail in the run folder.

Each node's sampler (local rank 0) takes a sample every `system.interval_s` on its own thread. On one node rank 0
holds them all. On several nodes they wait on their node until the training exchange at a log interval once
`system.interval_s` of training time has passed since the last (every rank decides alike from the gathered
totals), and once more at the end: two all-gathers then, the rows each rank has waiting (at most a few) and the
rows themselves, `2 + len(NODE_LEAVES) + slots x (1 + len(GPU_LEAVES))` float64 each. The training thread only
joins the gathers; rank 0's worker thread writes the rows and logs the metrics.

MLflow gets rank 0's node under MLflow's own names (its System metrics tab shows them as on one machine) and, from
two nodes on, the cluster's view (`reports.cluster_view`) of every node's latest sample, a fixed number of series
whatever the job's size; on one node there is no cluster to summarise and MLflow gets no copies of the node's own
series. Per-node series (`system/node_<k>/...`) only with `system.per_node_series`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from anemoi_profiler import names
from anemoi_profiler.clock import ExchangeControl, RankTotals
from anemoi_profiler.logs import get_logger
from anemoi_profiler.reports.cluster_view import cluster_view
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.run_files.system_tables import NodeMeans, NodeSample, SystemTableWriter

log = get_logger(__name__)

HEAD = 3
"""Each row starts with the node, the step and the time of its sample."""
GPU_ROW = 1 + len(names.GPU_LEAVES)
"""Each GPU of a row: its ordinal, then its figures."""


def row_length(gpu_slots: int) -> int:
    return HEAD + len(names.NODE_LEAVES) + gpu_slots * GPU_ROW


def encode(samples: Sequence[NodeSample], rows: int, gpu_slots: int) -> list[float]:
    """`rows` rows of `row_length(gpu_slots)` numbers, NaN where a sample has no such figure or no sample is."""
    payload = [math.nan] * (rows * row_length(gpu_slots))
    for index, sample in enumerate(samples[:rows]):
        row = [float(sample.node), float(sample.step), sample.time]
        row += [sample.values.get(leaf, math.nan) for leaf in names.NODE_LEAVES]
        for ordinal, values in sorted(sample.gpus.items())[:gpu_slots]:
            row += [float(ordinal), *(values.get(leaf, math.nan) for leaf in names.GPU_LEAVES)]
        start = index * row_length(gpu_slots)
        payload[start : start + len(row)] = row
    return payload


def decode(payload: Sequence[float], gpu_slots: int, host: str = "") -> list[NodeSample]:
    """The samples of one rank's `encode`d rows (rows of NaN left out)."""
    length, samples = row_length(gpu_slots), []
    for start in range(0, len(payload), length):
        row = payload[start : start + length]
        if math.isnan(row[0]):
            continue
        values = dict(zip(names.NODE_LEAVES, row[HEAD : HEAD + len(names.NODE_LEAVES)], strict=True))
        sample = NodeSample(int(row[0]), int(row[1]), row[2], _present(values), host=host)
        for slot in range(gpu_slots):
            gpu = row[HEAD + len(names.NODE_LEAVES) + slot * GPU_ROW :][:GPU_ROW]
            if not math.isnan(gpu[0]):
                sample.gpus[int(gpu[0])] = _present(dict(zip(names.GPU_LEAVES, gpu[1:], strict=True)))
        samples.append(sample)
    return samples


def _present(values: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in values.items() if not math.isnan(value)}


class NodeRecorder:
    """Rank 0: writes the samples to the run folder and logs the cluster's view (and, when asked, per-node series)."""

    def __init__(self, session: ProfilerSession, per_node_series: bool, several_nodes: bool) -> None:
        """`several_nodes`: log the cluster's view (on one node it would copy the node's own series)."""
        assert session.run_dir is not None
        self._session = session
        self._per_node_series = per_node_series
        self._several_nodes = several_nodes
        self._table = SystemTableWriter(session.run_dir)
        self.means = NodeMeans()
        """Each node's and GPU's means over the run, for the report."""
        self._latest: dict[int, NodeSample] = {}
        self._said: set[object] = set()

    def record(self, samples: list[NodeSample], step: int) -> None:
        """Keep `samples` and log the cluster's view of each node's latest sample at the training `step`."""
        try:
            self._table.append(samples)
            for sample in samples:
                self.means.add(sample)
                if self._per_node_series:
                    self._session.log_metrics(sample.metrics(f"node_{sample.node}"), sample.step)
                if sample.node not in self._latest or self._latest[sample.node].time <= sample.time:
                    self._latest[sample.node] = sample
            if samples and self._several_nodes:
                self._session.log_metrics(cluster_view(self._latest.values()), step)
        except Exception as error:
            log.warning_once(self._said, "record", "system metrics of the nodes: %s: %s", type(error).__name__, error)


class SystemExchange:
    """Every rank's part in bringing the nodes' samples to rank 0 (a hook of the clock's training exchange)."""

    def __init__(self, session: ProfilerSession, interval_s: float, recorder: NodeRecorder | None) -> None:
        """`recorder` on rank 0, None elsewhere."""
        self._session = session
        self._interval_s = interval_s
        self._recorder = recorder
        self._waiting: list[NodeSample] = []
        self._lock = threading.Lock()
        self._training_s = 0.0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anemoi-profiler-nodes")
        self._said: set[object] = set()

    def add(self, sample: NodeSample) -> None:
        """On the sampler's thread: keep the sample until the next exchange."""
        with self._lock:
            self._waiting.append(sample)

    def outgoing(self, control: ExchangeControl) -> None:
        """Nothing to say before the training exchange: the decision to exchange is read from its totals."""

    def received(self, step: int, ranks: list[RankTotals], controls: list[ExchangeControl]) -> None:
        """Exchange the waiting samples once `interval_s` of training time (rank 0's, as every rank received it)
        has passed since the last exchange."""
        self._training_s += ranks[0].elapsed_s
        if self._training_s >= self._interval_s:
            self._training_s = 0.0
            with self._session.own_work.measure():
                self._share(step)

    def finish(self, step: int) -> None:
        """At the end, on every rank (after the sampler's last sample): exchange what waits, and wait for rank 0's
        worker to have written it."""
        self._share(step)
        self._worker.shutdown(wait=True)

    def _share(self, step: int) -> None:
        with self._lock:
            mine, self._waiting = self._waiting, []
        exchange = self._session.exchange
        slots = max((len(sample.gpus) for sample in mine), default=0)
        counts = exchange.gather([float(len(mine)), float(slots)])
        if counts is None:
            return
        rows, slots = int(max(count[0] for count in counts)), int(max(count[1] for count in counts))
        if rows == 0:
            return
        gathered = exchange.gather(encode(mine, rows, slots))
        if gathered is not None and self._recorder is not None:
            self._worker.submit(self._record, gathered, slots, step)

    def _record(self, gathered: list[list[float]], slots: int, step: int) -> None:
        """On rank 0's worker: read the rows, with each sending rank's host, and hand them to the recorder."""
        assert self._recorder is not None
        hosts = self._session.hosts
        samples = []
        try:
            for rank, payload in enumerate(gathered):
                samples += decode(payload, slots, hosts[rank] if rank < len(hosts) else "")
        except Exception as error:
            log.warning_once(self._said, "decode", "system metrics of the nodes: %s: %s", type(error).__name__, error)
        self._recorder.record(samples, step)
