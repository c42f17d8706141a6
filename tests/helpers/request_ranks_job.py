"""One of the first three processes of a job of `world_size` ranks, on a real gloo group: rank 0 gets a request
naming ranks far above 52, and every process must plan the window on exactly those ranks.

Run by `test_triggered_windows.py` as `python request_ranks_job.py <rank> <port> <world_size> <run_dir>`; the
job's other ranks are not started (the exchange is among the three), so only the rank numbers are large.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch.distributed as dist

from anemoi_profiler import ProfilerConfig
from anemoi_profiler.clock import ExchangeControl, RankTotals
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.distributed.profiled_ranks import select_profiled_ranks
from anemoi_profiler.run.window_triggers import TriggerWatch
from anemoi_profiler.triggers.requests import new_request, write_request

PROCESSES = 3
NAMED = [0, 777, 1199, 1500]
"""1500 is no rank of a 1,200-rank job: left out."""


def main(rank: int, port: int, world_size: int, run_dir: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=PROCESSES)
    exchange = RankExchange(timeout_s=60)
    overrides = ["triggers.enabled=true", "triggers.request_poll_s=0.05", "triggers.drift=false"]
    config = ProfilerConfig.load(None, [f"output_dir={run_dir}", *overrides])
    if rank == 0:
        write_request(run_dir, new_request(2, NAMED))
    profiled = select_profiled_ranks(config.distributed.profiled_ranks, world_size)
    watch = TriggerWatch.of_config(config, world_size, rank, run_dir, exchange, profiled)
    if rank == 0:
        time.sleep(0.5)  # the poller has read the request
    sizes = set()
    for interval in range(1, 4):
        local, control = RankTotals(batches=10, elapsed_s=0.1), ExchangeControl()
        watch.outgoing(control)
        sent = local.to_list() + control.to_list()
        sizes.add(len(sent))
        gathered = exchange.gather(sent)
        assert gathered is not None
        size = len(local.to_list())
        ranks = [RankTotals.from_list(values[:size]) for values in gathered]
        watch.received(10 * interval, ranks, [ExchangeControl.from_list(values[size:]) for values in gathered])
        if watch.pending is not None:
            break
    exchange.close()
    assert sizes == {len(RankTotals().to_list()) + len(ExchangeControl().to_list())}, "the request grew the exchange"
    assert watch.pending is not None and watch.pending.reason == "request", "no window planned"
    assert watch.pending.ranks == NAMED[:3], watch.pending.ranks
    assert watch.pending.decided_at_step == 10, "not served at the first exchange"


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
