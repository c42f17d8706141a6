"""`distributed.profiled_ranks`: every rank of a small job, a bounded selection of a large one, lists as given."""

from __future__ import annotations

import itertools

import pytest

from anemoi_profiler import ProfilerConfig
from anemoi_profiler.config import ConfigError
from anemoi_profiler.distributed.profiled_ranks import MOST_RANKS, describe_ranks, select_profiled_ranks


def hosts_of(world_size: int, ranks_per_node: int) -> list[str]:
    return [f"node{rank // ranks_per_node}" for rank in range(world_size)]


def test_auto_is_the_default() -> None:
    assert ProfilerConfig().distributed.profiled_ranks == "auto"


@pytest.mark.parametrize("world_size", [1, 2, 8])
def test_auto_profiles_every_rank_of_a_job_of_up_to_8_ranks(world_size: int) -> None:
    assert select_profiled_ranks("auto", world_size, hosts_of(world_size, 4)) == list(range(world_size))
    assert select_profiled_ranks("auto", world_size) == list(range(world_size))


def test_auto_at_64_ranks_of_4_per_node() -> None:
    ranks = select_profiled_ranks("auto", 64, hosts_of(64, 4))
    assert len(ranks) == MOST_RANKS
    assert ranks[:4] == [0, 1, 2, 3]  # rank 0's node
    assert ranks[-1] == 63  # the last rank
    others = ranks[4:-1]
    assert all(rank % 4 == 0 for rank in others)  # first ranks of nodes
    assert others[0] == 4 and others[-1] == 60  # spread from the second node to the last one
    assert len(set(ranks)) == len(ranks)


def test_auto_at_1000_ranks_of_8_per_node_stays_bounded_and_spread() -> None:
    ranks = select_profiled_ranks("auto", 1000, hosts_of(1000, 8))
    assert len(ranks) == MOST_RANKS
    assert ranks[:8] == list(range(8)) and ranks[-1] == 999
    others = ranks[8:-1]
    assert all(rank % 8 == 0 for rank in others) and others[0] == 8 and others[-1] == 992
    gaps = [b - a for a, b in itertools.pairwise(others)]
    assert max(gaps) - min(gaps) <= 8  # evenly spread: gaps differ by at most one node


def test_auto_with_few_nodes_takes_each_nodes_first_rank() -> None:
    assert select_profiled_ranks("auto", 16, hosts_of(16, 8)) == [*range(8), 8, 15]
    assert select_profiled_ranks("auto", 12, hosts_of(12, 2)) == [0, 1, 2, 4, 6, 8, 10, 11]


def test_auto_without_host_names_takes_the_first_8_ranks_and_the_last() -> None:
    assert select_profiled_ranks("auto", 1000) == [*range(8), 999]


def test_all_and_lists_are_kept() -> None:
    assert select_profiled_ranks("all", 1000, hosts_of(1000, 8)) == list(range(1000))
    assert select_profiled_ranks([5, 1, 1, 3000], 1000) == [1, 5]  # a rank the job does not have is left out
    assert select_profiled_ranks([1], 2) == [1]


def test_describe_ranks_shows_ranges_and_how_many() -> None:
    assert describe_ranks([0, 1, 2, 3, 8, 999], 1000) == "0-3, 8, 999 (6 of 1000 ranks)"
    assert describe_ranks([0, 1], 2) == "every rank (2)"
    assert describe_ranks([1], 2) == "1 (1 of 2 ranks)"


def test_the_config_rejects_other_words() -> None:
    with pytest.raises(ConfigError, match=r"distributed\.profiled_ranks: got 'some'"):
        ProfilerConfig.load(None, ["distributed.profiled_ranks=some"])
