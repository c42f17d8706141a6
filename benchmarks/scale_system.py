"""The system metrics of every node at `benchmarks/scale.py`'s simulated world sizes: their way to rank 0, the run
folder and one MLflow run.

Each simulated node's first rank makes up a system sample every simulated `system.interval_s` (the node's 9
figures and 7 for each of `gpus` GPUs, what the system sampler gives on a GPU node with RAPL). The samples take
the profiler's own path: the run's `SystemExchange` over the ranks' `RankExchange`, as a hook of a training log
interval's exchange carrying one `system.interval_s` of training time, so every log interval exchanges samples.
Rank 0 logs its node under MLflow's own names, as the system callback does, and its `NodeRecorder` writes
`system_metrics/nodes.csv` and `gpus.csv` and logs the cluster's view, through the profiler's tracking sink, to
one MLflow run in a sqlite store in a temporary run folder. On one node there is no exchange: rank 0 records its
samples at once, as the callback does. The MLflow points and series are counted in the store, the bytes in the
run folder's tables; both are scaled to an hour of training at that `system.interval_s`.
"""

from __future__ import annotations

import contextlib
import math
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.clock import RankTotals
from anemoi_profiler.clock.intervals import ExchangeControl
from anemoi_profiler.cluster.system_nodes import NodeRecorder, SystemExchange
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.run.session import ProfilerSession, open_sink
from anemoi_profiler.run_files.layout import SYSTEM_GPUS_FILE, SYSTEM_METRICS_DIR, SYSTEM_NODES_FILE
from anemoi_profiler.run_files.system_tables import NodeSample, read_system_table

SENDER_TIMEOUT_S = 300.0
"""How long rank 0 waits at the end for the tracking sink's sender (it creates the sqlite store first)."""


NODE_TYPICAL = (35.0, 250_000.0, 50.0, 40.0, 400_000.0, 600_000.0, 5_000.0, 5_000.0, 2_000_000.0)
"""A GPU node's typical value of each of `names.NODE_LEAVES`: the made-up figures have as many digits."""
GPU_TYPICAL = (90.0, 60_000.0, 75.0, 550.0, 80.0, 65.0, 500_000.0)
"""A GPU's typical value of each of `names.GPU_LEAVES`."""


def made_up_sample(node: int, gpus: int, step: int, at: float) -> NodeSample:
    """A node's sample with every figure the sampler gives on a GPU node, each within 20 % of its typical value."""
    draw = random.Random(node * 1_000_003 + step).uniform
    values = {leaf: typical * draw(0.8, 1.2) for leaf, typical in zip(names.NODE_LEAVES, NODE_TYPICAL, strict=True)}
    sample = NodeSample(node, step, at, values, host=f"node{node}")
    for ordinal in range(gpus):
        sample.gpus[ordinal] = {
            leaf: typical * draw(0.8, 1.2) for leaf, typical in zip(names.GPU_LEAVES, GPU_TYPICAL, strict=True)
        }
    return sample


class TimedRecorder(NodeRecorder):
    """The recorder, keeping the seconds, and the CPU seconds of its thread, each `record` took on rank 0's worker
    thread (the tables, the cluster's view, the metrics queued for MLflow)."""

    def __init__(self, session: ProfilerSession, several_nodes: bool) -> None:
        super().__init__(session, per_node_series=False, several_nodes=several_nodes)
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []

    def record(self, samples: list[NodeSample], step: int) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        super().record(samples, step)
        self.seconds.append(time.perf_counter() - started)
        self.cpu_seconds.append(time.thread_time() - cpu_started)


def run_system(
    rank: int, world: int, exchange: RankExchange, hosts: list[str], args: Any, totals: Any
) -> dict[str, Any]:
    """One rank's part in `args.system_intervals` intervals of system samples; rank 0's report holds the run
    folder's and the MLflow run's figures. `totals(rank, interval, elapsed_s)` are a rank's made-up totals."""
    ranks_per_node, interval_s = args.ranks_per_node, args.system_interval_s
    nodes, node = math.ceil(world / ranks_per_node), rank // ranks_per_node
    session = ProfilerSession()
    session.exchange, session.hosts = exchange, hosts
    with contextlib.ExitStack() as stack:
        recorder = None
        if rank == 0:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-system-")))
            session.run_dir = run_dir
            uri = f"sqlite:///{run_dir / 'mlflow.db'}"
            session.sink = open_sink(session.config, run_dir, 0, uri, run_name=f"scale {world} ranks")
            recorder = TimedRecorder(session, several_nodes=nodes > 1)
        system = SystemExchange(session, interval_s, recorder) if nodes > 1 else None
        shared_s, shared_cpu_s, started_at, step = [], [], time.time(), 0
        for interval in range(args.system_intervals):
            step = (interval + 1) * 10
            sample = None
            if rank % ranks_per_node == 0:
                sample = made_up_sample(node, args.gpus_per_node, step, started_at + interval * interval_s)
            if rank == 0 and sample is not None:
                session.log_metrics(sample.metrics(), step)  # MLflow's own names: its System metrics tab
            if system is None:
                if recorder is not None and sample is not None:
                    recorder.record([sample], step)
                continue
            if sample is not None:
                system.add(sample)
            local = totals(rank, interval, interval_s).to_list() + ExchangeControl().to_list()
            gathered = exchange.gather(local)  # the training log interval's exchange, whose hook it is
            if gathered is None:
                break
            size = len(RankTotals().to_list())
            started, cpu_started = time.perf_counter(), time.thread_time()
            system.received(step, [RankTotals.from_list(values[:size]) for values in gathered], [])
            shared_s.append(time.perf_counter() - started)
            shared_cpu_s.append(time.thread_time() - cpu_started)
        if system is not None:
            system.finish(step)  # every rank; rank 0 waits for its worker to have recorded everything
        if recorder is None:
            return {"shared_s": shared_s, "shared_cpu_s": shared_cpu_s}
        assert session.sink is not None and session.run_dir is not None
        sent = session.sink.close(timeout_s=SENDER_TIMEOUT_S)
        return {
            "shared_s": shared_s,
            "shared_cpu_s": shared_cpu_s,
            "record_s": recorder.seconds,
            "record_cpu_s": recorder.cpu_seconds,
            "sent": sent,
            **store_counts(session.run_dir / "mlflow.db"),
            **table_figures(session.run_dir),
        }


def store_counts(database: Path) -> dict[str, int]:
    """The metric points and series of the store's one run, counted in its tables."""
    with contextlib.closing(sqlite3.connect(database)) as store:
        runs, points, series = store.execute(
            "SELECT COUNT(DISTINCT run_uuid), COUNT(*), COUNT(DISTINCT key) FROM metrics"
        ).fetchone()
    return {"mlflow_runs": runs, "mlflow_points": points, "mlflow_series": series}


def table_figures(run_dir: Path) -> dict[str, Any]:
    """The bytes of the run folder's system tables, and which nodes and how many rows they hold."""
    folder = run_dir / SYSTEM_METRICS_DIR
    node_table, gpu_table = read_system_table(run_dir)
    return {
        "table_bytes": sum((folder / name).stat().st_size for name in (SYSTEM_NODES_FILE, SYSTEM_GPUS_FILE)),
        "table_nodes": sorted({int(str(node)) for node in node_table["node"]}),
        "table_gpu_nodes": sorted({int(str(node)) for node in gpu_table["node"]}),
        "node_rows": len(node_table["node"]),
        "gpu_rows": len(gpu_table["node"]),
    }
