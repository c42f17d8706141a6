"""One rank of a two-process gloo job that exchanges as a profiler session does, closes, and exits at once.

Run by `test_distributed.py` as `python exchange_exit_job.py <rank> <port> [<sessions>]`. Exits non-zero when the
profiler's group leaves a thread behind; dies with SIGABRT when a gloo worker thread still holds the last
all-gather's tensors as the interpreter finalizes (the failure `RankExchange.close` prevents). With several
sessions, each opens, uses and closes its own exchange, as consecutive fits do: a close that waits for a gloo
worker thread which waits for the GIL never returns (the failure the exchange's buffers prevent on torch < 2.5).
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from anemoi_profiler.distributed.exchange import RankExchange


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main(rank: int, port: int, sessions: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    before = threads()
    for _ in range(sessions):
        exchange = RankExchange(timeout_s=60)
        for interval in range(5):
            assert exchange.gather([float(rank), float(interval)]) == [[0.0, interval], [1.0, interval]]
        assert exchange.gather([0.0]) == [[0.0], [0.0]]  # the session's end barrier
        exchange.close()
        assert exchange.gather([0.0]) is None  # closed: no collective on a destroyed group
        assert threads() == before, f"the profiler's group left {threads() - before} thread(s) running"


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
