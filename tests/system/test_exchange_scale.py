"""The profiler's exchange between ranks as a tree of small gloo groups, at 8 and 16 real processes.

The ranks are those of `benchmarks/scale.py` (a light stand-in of a rank: the exchange, the straggler figures of
made-up totals, a window summary's row, made-up system samples through the run's `SystemExchange` to rank 0's run
folder and MLflow run), grouped into simulated nodes of consecutive ranks.

Not in the version matrix: the harness forks its ranks from one process that imported torch, and on torch 2.4
such forked ranks sometimes never finish (2 of 6 runs of 16 ranks), with or without the system part. The tree
itself runs on every tested stack in real processes: tests/system/test_distributed.py's two-node torchrun job.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anemoi_profiler import names
from anemoi_profiler.distributed.exchange import FAN_OUT, exchange_levels
from tests.helpers.jobs import job_environment

SCALE = Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"


def scale_rows(tmp_path: Path, worlds: list[int], *args: str) -> list[dict[str, Any]]:
    out = tmp_path / "scale.json"
    command = [sys.executable, str(SCALE), "--worlds", *map(str, worlds), "--intervals", "3", "--out", str(out), *args]
    subprocess.run(command, env=job_environment(), timeout=240, check=True)
    rows: list[dict[str, Any]] = json.loads(out.read_text())["exchanges"]["tree"]["rows"]
    return rows


def scale_row(tmp_path: Path, world: int, *args: str) -> dict[str, Any]:
    return scale_rows(tmp_path, [world], *args)[0]


def test_the_groups_are_nodes_then_their_first_ranks_in_groups_of_at_most_the_fan_out() -> None:
    levels = exchange_levels(10_000, ranks_per_node=8)
    assert levels[0] == [list(range(start, start + 8)) for start in range(0, 10_000, 8)]
    assert [len(groups) for groups in levels] == [1250, 40, 2, 1]
    assert all(len(members) <= FAN_OUT for groups in levels for members in groups)
    for below, above in itertools.pairwise(levels):
        assert [members for group in above for members in group] == [group[0] for group in below]
    assert exchange_levels(2, ranks_per_node=2) == [[[0, 1]]]  # one node: one group, as with a single group
    assert exchange_levels(4, ranks_per_node=1) == [[[0, 1, 2, 3]]]  # a rank per node: no group of one


@pytest.mark.slow
def test_sixteen_ranks_on_four_nodes_hold_sockets_for_their_node_and_the_nodes_only(tmp_path: Path) -> None:
    row = scale_row(tmp_path, 16, "--ranks-per-node", "4")
    ranks = list(range(16))
    assert row["reported_ranks"] == ranks
    assert row["complete_ranks"] == ranks  # every rank's totals, rows and host name on every rank, rank 0's text
    assert max(row["sockets"]) <= 4 + 4  # its node's ranks plus the nodes' first ranks (a full mesh: 16)
    assert row["sockets"] == row["sockets_predicted"]
    assert row["rank_0_figures"][names.TRAIN_DATALOADER_SLOWEST_RANK] == 2  # the last interval's made-up straggler


@pytest.mark.slow
def test_four_nodes_add_only_the_cluster_view_to_mlflow_and_every_node_reaches_the_run_folder(tmp_path: Path) -> None:
    one_node, four_nodes = scale_rows(tmp_path, [4, 16], "--ranks-per-node", "4", "--system-intervals", "3")
    assert (one_node["nodes"], four_nodes["nodes"]) == (1, 4)
    own = len(names.NODE_LEAVES) + 8 * len(names.GPU_LEAVES)  # rank 0's node under MLflow's names
    cluster = len(names.CLUSTER_STATISTICS) * len(names.NODE_LEAVES) + (len(names.CLUSTER_STATISTICS) + 1) * len(
        names.GPU_LEAVES
    )  # the same whatever the number of nodes; none on one node, which has no cluster to summarise
    assert (one_node["mlflow_series"], four_nodes["mlflow_series"]) == (own, own + cluster)
    for row in (one_node, four_nodes):
        assert row["sent"] and row["mlflow_runs"] == 1
        assert row["mlflow_points"] == 3 * row["mlflow_series"]  # one point per series and interval
    assert four_nodes["table_nodes"] == four_nodes["table_gpu_nodes"] == [0, 1, 2, 3]
    assert (four_nodes["node_rows"], four_nodes["gpu_rows"]) == (4 * 3, 4 * 8 * 3)  # every sample of every node


@pytest.mark.slow
@pytest.mark.parametrize("failure", [["--late-rank", "5", "--late-s", "12"], ["--dead-rank", "6"]])
def test_a_late_or_dead_rank_leaves_the_others_ending_without_its_figures(tmp_path: Path, failure: list[str]) -> None:
    row = scale_row(tmp_path, 8, "--ranks-per-node", "4", "--timeout-s", "4", *failure)
    alive = [rank for rank in range(8) if failure[:2] != ["--dead-rank", str(rank)]]
    assert row["reported_ranks"] == alive  # no rank hangs
    assert row["complete_ranks"] == []  # and none takes partial figures for the whole job's
