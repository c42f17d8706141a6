"""The profiler's exchange between ranks at many ranks, simulated with real processes on one machine.

Each rank is a light stand-in forked from this process (torch is imported once and shared copy-on-write): it
joins a gloo job, creates the profiler's `RankExchange` with `--ranks-per-node` consecutive ranks to a simulated
node, and exchanges what a training log interval exchanges: the stage clock's totals and control message (made
up, a different straggler on each interval), then the window summaries' rows, from which rank 0 computes the
straggler figures. Per world size it reports the sockets each rank opened for the exchange (counted in
/proc/self/fd), the time to create the groups, and the time of one log interval's exchange (the median over
intervals of the slowest rank), then fits a power of the world size to each to read off 1,000 and 10,000 ranks; the
sockets at those sizes come from the groups the exchange would make there (`exchange_levels`). With
`--exchanges tree one-group` the runs alternate with a control: one gloo group over all ranks, all-gathers on it.
Each run of the profiler's exchange then takes `--system-intervals` intervals of the nodes' system samples to rank
0's run folder and one MLflow run (`scale_system.py`): MLflow points and series, the tables' bytes and the times
of the samples' exchange and of rank 0's recording, fitted alike.

    python benchmarks/scale.py --worlds 2 4 8 16 32 64 128 --exchanges tree one-group --repeats 3 \
        --out benchmarks/results/scale.json

All ranks share this machine's cores: on fewer cores than ranks, the times are those of an oversubscribed
machine (each exchange waits for ranks to be scheduled), an upper bound of the time on a cluster's nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import queue
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from scale_system import run_system

from anemoi_profiler.clock import RankTotals
from anemoi_profiler.clock.intervals import ExchangeControl
from anemoi_profiler.clock.rank_figures import collective_wait_figures, gap_figures, step_figures
from anemoi_profiler.cluster.window_exchange import ROW_LENGTH
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.distributed.exchange import RankExchange, exchange_levels


def sockets() -> int:
    """This process's open sockets."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed while listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def made_up_totals(rank: int, interval: int, elapsed_s: float = 1.0) -> RankTotals:
    """One log interval's totals of a rank; rank `interval` waits longest for data."""
    return RankTotals(
        batches=10.0,
        samples=40.0,
        wait_s=0.01 + 0.1 * (rank == interval),
        elapsed_s=elapsed_s,
        callbacks_s=0.002,
        loop_s=0.003,
        fetches=10.0,
        sync_steps=10.0,
        collective_wait_s=0.05 + 0.001 * rank,
        peak_allocated_mb=100.0 + rank,
    )


class OneGroup:
    """The control: one gloo group over all ranks and all-gathers on it, as the exchange was before its tree."""

    def __init__(self, timeout_s: float) -> None:
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.world_size = dist.get_world_size()

    def gather(self, values: list[float]) -> list[list[float]] | None:
        local = torch.tensor(values, dtype=torch.float64)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        try:
            dist.all_gather(gathered, local, group=self.group)
        except RuntimeError:
            return None
        return [tensor.tolist() for tensor in gathered]

    def gather_texts(self, text: str) -> list[str]:
        texts: list[Any] = [None] * self.world_size
        dist.all_gather_object(texts, text, group=self.group)
        return texts

    def broadcast_text(self, text: str) -> str | None:
        sent: list[Any] = [text]
        dist.broadcast_object_list(sent, src=0, group=self.group)
        return str(sent[0])

    def close(self) -> None:
        dist.destroy_process_group(self.group)


EXCHANGES = ("tree", "one-group")
"""The profiler's `RankExchange`; the control, `OneGroup`."""


def rank_main(rank: int, world: int, port: int, kind: str, args: argparse.Namespace, results: Any) -> None:
    """One rank: join the job, create the exchange, exchange `args.intervals` log intervals, report to `results`.

    `args.late_rank` sleeps `args.late_s` before the exchange of interval 1; `args.dead_rank` ends there."""
    ranks_per_node, intervals = args.ranks_per_node, args.intervals
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"  # the job's own group (NCCL's on a cluster) opens no socket here
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    del os.environ["TORCH_GLOO_LAZY_INIT"]
    dist.barrier()  # all ranks are up: the creation's time is not another rank's start
    before = sockets()
    started, cpu_started = time.perf_counter(), time.process_time()
    exchange = OneGroup(args.timeout_s) if kind == "one-group" else RankExchange(args.timeout_s, ranks_per_node)
    created_s, created_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    opened = sockets() - before
    hosts = exchange.gather_texts(f"node{rank // ranks_per_node}")
    times, cpu_times, complete, figures = [], [], True, {}
    for interval in range(intervals):
        if interval == 1 and rank == args.dead_rank:
            return
        if interval == 1 and rank == args.late_rank:
            time.sleep(args.late_s)
        started, cpu_started = time.perf_counter(), time.process_time()
        totals = made_up_totals(rank, interval)
        gathered = exchange.gather(totals.to_list() + ExchangeControl().to_list())
        rows = exchange.gather(np.full(ROW_LENGTH, float(rank)).tolist())  # one window summary's row
        times.append(time.perf_counter() - started)
        cpu_times.append(time.process_time() - cpu_started)
        if gathered is None or rows is None:
            complete = False
            break
        size = len(totals.to_list())
        ranks = [RankTotals.from_list(values[:size]) for values in gathered]
        complete &= [values[0] for values in rows] == [float(r) for r in range(world)]
        complete &= ranks == [made_up_totals(r, interval) for r in range(world)]
        if rank == 0:
            figures = {**step_figures("train", ranks), **gap_figures("train", ranks), **collective_wait_figures(ranks)}
    system = {}
    if kind == "tree" and args.system_intervals and complete:
        system = run_system(rank, world, exchange, hosts, args, made_up_totals)
    request = exchange.broadcast_text("window" if rank == 0 else "")
    exchange.close()
    results.put(
        {
            "rank": rank,
            "sockets": opened,
            "created_s": created_s,
            "created_cpu_s": created_cpu_s,
            "interval_s": times,
            "interval_cpu_s": cpu_times,
            "complete": complete
            and request == "window"
            and hosts == [f"node{r // ranks_per_node}" for r in range(world)],
            "figures": figures,
            "system": system,
        }
    )
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_world(world: int, kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The reports of the ranks that ended within the time limit, by rank."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=rank_main, args=(rank, world, port, kind, args, results)) for rank in range(world)]
    for process in ranks:
        process.start()
    reports = []
    deadline = time.monotonic() + args.timeout_s * 3 + 60
    while time.monotonic() < deadline and (any(process.is_alive() for process in ranks) or not results.empty()):
        with contextlib.suppress(queue.Empty):  # read while ranks end: a rank's queue is flushed as it exits
            reports.append(results.get(timeout=0.2))
    for process in ranks:
        if process.is_alive():
            process.kill()
    return sorted(reports, key=lambda report: report["rank"])


def predicted_sockets(world: int, ranks_per_node: int, exchange: str = "tree") -> list[int]:
    """Each rank's sockets for the exchange: in each of its groups, one per other member and gloo's listening one."""
    if exchange == "one-group":
        return [world] * world
    opened = [0] * world
    for groups in exchange_levels(world, ranks_per_node):
        for members in groups:
            for member in members:
                opened[member] += len(members)
    return opened


def rank_median(report: dict[str, Any]) -> float:
    """A rank's median CPU seconds (all its threads) in one log interval's exchange, the first left out."""
    return statistics.median(report["interval_cpu_s"][1:] or report["interval_cpu_s"] or [math.nan])


def interval_median(reports: list[dict[str, Any]], key: str) -> float:
    """The median over log intervals (the first left out: it connects) of the slowest rank's time; nan if none."""
    exchanged = min(len(report[key]) for report in reports) if reports else 0
    if exchanged < 2:
        return math.nan
    return statistics.median(max(report[key][i] for report in reports) for i in range(1, exchanged))


def fit(worlds: list[int], values: list[float]) -> dict[str, float]:
    """Least squares of `a * world ** exponent` (a line in log-log), and its value at 1,000 and 10,000 ranks."""
    exponent, log_a = np.polyfit(np.log(np.array(worlds, dtype=float)), np.log(np.array(values, dtype=float)), 1)
    return {
        "a": float(np.exp(log_a)),
        "exponent": float(exponent),
        "at_1000": float(np.exp(log_a) * 1_000**exponent),
        "at_10000": float(np.exp(log_a) * 10_000**exponent),
    }


TIMES = ("create_s_max", "create_cpu_s_max", "interval_s_median", "interval_cpu_s_median", "interval_cpu_s_max")
"""The figures that vary from run to run: their median over repeats is kept, and each is fitted."""
SYSTEM_TIMES = ("shared_s_median", "shared_cpu_s_median", "record_s_median", "record_cpu_s_median")
SYSTEM_FITTED = ("mlflow_points_per_hour", "table_bytes_per_hour", *SYSTEM_TIMES)
"""The system metrics' figures fitted, over the world sizes of more than one node (one node has no exchange)."""


def measure(world: int, exchange: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of `world` ranks with `exchange`: its figures, and the lists behind them."""
    started = time.perf_counter()
    reports = run_world(world, exchange, args)
    if len(reports) < world:
        print(f"{world} ranks: only {len(reports)} reported", file=sys.stderr)
    measured = [report["sockets"] for report in reports]
    return {
        "world": world,
        "nodes": math.ceil(world / args.ranks_per_node),
        "reported": len(reports),
        "reported_ranks": [report["rank"] for report in reports],
        "complete_ranks": [report["rank"] for report in reports if report["complete"]],
        "sockets": measured,
        "sockets_predicted": predicted_sockets(world, args.ranks_per_node, exchange),
        "sockets_max": max(measured),
        "sockets_mean": statistics.fmean(measured),
        "create_s_max": max(report["created_s"] for report in reports),
        "create_cpu_s_max": max(report["created_cpu_s"] for report in reports),
        "interval_s_median": interval_median(reports, "interval_s"),
        "interval_cpu_s_median": statistics.median(rank_median(report) for report in reports),
        "interval_cpu_s_max": max(rank_median(report) for report in reports),
        "rank_0_figures": reports[0]["figures"] if reports and reports[0]["rank"] == 0 else {},
        **system_figures(reports, args),
        "wall_s": time.perf_counter() - started,
    }


def system_figures(reports: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Rank 0's MLflow run and run folder, scaled to an hour of training; the slowest rank's time in the samples'
    exchange, rank 0's CPU time in it (its training thread's), and rank 0's time and CPU time in recording them
    (its worker thread's), medians over the intervals (the first left out); {} without them."""
    zero = reports[0]["system"] if reports and reports[0]["rank"] == 0 else {}
    if not zero:
        return {}
    per_hour = 3600 / args.system_interval_s / args.system_intervals

    def median(key: str) -> float:
        values = zero[key][1:] or zero[key]
        return statistics.median(values) if values else math.nan

    lists = ("shared_s", "shared_cpu_s", "record_s", "record_cpu_s")
    return {
        **{key: value for key, value in zero.items() if key not in lists},
        "gpus_per_node": args.gpus_per_node,
        "system_intervals": args.system_intervals,
        "mlflow_points_per_hour": zero["mlflow_points"] * per_hour,
        "table_bytes_per_hour": zero["table_bytes"] * per_hour,
        "shared_s_median": interval_median([report["system"] for report in reports], "shared_s"),
        **{f"{key}_median": median(key) for key in lists[1:]},
    }


def summary(runs: list[dict[str, Any]], args: argparse.Namespace, exchange: str) -> dict[str, Any]:
    """One exchange's rows (the last run of each world size, its times the medians over the repeats), fits and
    sockets at 1,000 and 10,000 ranks."""
    rows = []
    for world in args.worlds:
        repeats = [run for run in runs if run["world"] == world]
        times = [key for key in (*TIMES, *SYSTEM_TIMES) if key in repeats[-1]]
        rows.append({**repeats[-1], **{key: statistics.median(run[key] for run in repeats) for key in times}})
    worlds = [row["world"] for row in rows]
    several_nodes = [row for row in rows if row["nodes"] > 1 and "mlflow_points" in row]
    return {
        "rows": rows,
        "fits": {key: fit(worlds, [row[key] for row in rows]) for key in TIMES if len(set(worlds)) > 1},
        "system_fits": {
            key: fit([row["world"] for row in several_nodes], [row[key] for row in several_nodes])
            for key in SYSTEM_FITTED
            if len(several_nodes) > 1
        },
        "sockets_at": {
            str(world): {"max": max(opened), "mean": statistics.fmean(opened)}
            for world in (1_000, 10_000)
            for opened in [predicted_sockets(world, args.ranks_per_node, exchange)]
        },
    }


def markdown(result: dict[str, Any]) -> str:
    """docs/distributed.md's table: each exchange's measured rows, then 1,000 and 10,000 ranks read off the fits."""
    exchanges = result["exchanges"]
    names = " / ".join(exchanges)
    lines = [
        f"| ranks | nodes | sockets per rank, most (mean): {names} | group creation, ms (CPU ms): {names} "
        f"| exchange per log interval, ms: {names} | CPU per rank and interval, ms, median (most): {names} |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cells(figures: list[dict[str, Any]]) -> str:
        columns = [
            [f"{f['sockets_max']:.0f} ({f['sockets_mean']:.1f})" for f in figures],
            [f"{f['create_s_max'] * 1e3:.0f} ({f['create_cpu_s_max'] * 1e3:.0f})" for f in figures],
            [f"{f['interval_s_median'] * 1e3:.0f}" for f in figures],
            [f"{f['interval_cpu_s_median'] * 1e3:.1f} ({f['interval_cpu_s_max'] * 1e3:.1f})" for f in figures],
        ]
        return " | ".join(" / ".join(column) for column in columns)

    first = next(iter(exchanges.values()))
    for index, row in enumerate(first["rows"]):
        lines.append(f"| {row['world']} | {row['nodes']} | {cells([e['rows'][index] for e in exchanges.values()])} |")
    for world in (1_000, 10_000) if first["fits"] else ():
        at = f"at_{world}"
        read_off = [
            {
                "sockets_max": e["sockets_at"][str(world)]["max"],
                "sockets_mean": e["sockets_at"][str(world)]["mean"],
                **{key: e["fits"][key][at] for key in TIMES},
            }
            for e in exchanges.values()
        ]
        lines.append(f"| {world:,} (fit) | {math.ceil(world / result['ranks_per_node']):,} | {cells(read_off)} |")
    return "\n".join(lines)


def system_markdown(result: dict[str, Any]) -> str:
    """docs/distributed.md's table of the system metrics: the measured rows, then 1,000 and 10,000 ranks read off
    the fits (the series do not depend on the world size: the largest measured is repeated)."""
    tree = result["exchanges"]["tree"]
    rows = [row for row in tree["rows"] if "mlflow_points" in row]
    if not rows:
        return ""
    lines = [
        "| ranks | nodes | MLflow series | MLflow points per hour | system tables, MB per hour "
        "| samples' exchange per interval, ms (rank 0's CPU ms) | rank 0's recording per interval, ms (CPU ms) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cells(figures: dict[str, Any]) -> str:
        shared = f"{figures['shared_s_median'] * 1e3:.0f} ({figures['shared_cpu_s_median'] * 1e3:.1f})"
        shared = "-" if math.isnan(figures["shared_s_median"]) else shared  # one node: no exchange
        return (
            f"{figures['mlflow_series']} | {figures['mlflow_points_per_hour']:,.0f} "
            f"| {figures['table_bytes_per_hour'] / 1e6:.1f} | {shared} "
            f"| {figures['record_s_median'] * 1e3:.1f} ({figures['record_cpu_s_median'] * 1e3:.1f})"
        )

    for row in rows:
        lines.append(f"| {row['world']} | {row['nodes']} | {cells(row)} |")
    for world in (1_000, 10_000) if tree["system_fits"] else ():
        read_off = {key: tree["system_fits"][key][f"at_{world}"] for key in SYSTEM_FITTED}
        read_off["mlflow_series"] = rows[-1]["mlflow_series"]
        lines.append(f"| {world:,} (fit) | {math.ceil(world / result['ranks_per_node']):,} | {cells(read_off)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument("--intervals", type=int, default=7)
    parser.add_argument(
        "--exchanges", nargs="+", choices=EXCHANGES, default=["tree"], help="one-group: the control, as before"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each world size, the exchanges alternating")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="the exchange's distributed.timeout_s")
    parser.add_argument("--late-rank", type=int, help="a rank that comes late to interval 1's exchange")
    parser.add_argument("--late-s", type=float, default=0.0, help="how late it comes")
    parser.add_argument("--dead-rank", type=int, help="a rank that ends before interval 1's exchange")
    parser.add_argument(
        "--system-intervals", type=int, default=6, help="simulated system.interval_s of samples (tree only); 0: none"
    )
    parser.add_argument(
        "--system-interval-s", type=float, default=ProfilerConfig().system.interval_s, help="system.interval_s"
    )
    parser.add_argument("--gpus-per-node", type=int, default=8, help="simulated GPUs in each node's samples")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {exchange: [] for exchange in args.exchanges}
    for world in args.worlds:
        for _ in range(args.repeats):
            for exchange in args.exchanges:
                runs[exchange].append(measure(world, exchange, args))
                figures = {key: value for key, value in runs[exchange][-1].items() if not isinstance(value, list)}
                print(json.dumps({"exchange": exchange, **figures}), flush=True)
    result = {
        "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()},
        "ranks_per_node": args.ranks_per_node,
        "exchanges": {exchange: summary(runs[exchange], args, exchange) for exchange in args.exchanges},
    }
    print(markdown(result))
    print(system_markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
