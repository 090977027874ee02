"""The layout in one line at start, and a rank count that does not give the λ asked for
(issue 25, "no silent traps": the same mpiexec -n 7 gives λ = 4 under hardsync, 5 under sync)."""

from __future__ import annotations

import pytest

from pserver.errors import TopologyError
from pserver.plan.config import load_config
from pserver.plan.layout_line import layout_line, ranks
from pserver.plan.topology import make_layout


def line(world: int, *overrides: str) -> str:
    cfg = load_config(None, list(overrides))
    c = cfg.cluster
    return layout_line(make_layout(world, cfg), cfg.protocol.name, c.tree_fanout, c.bcast_fanout)


def test_ranges():
    assert ranks([6, 3, 4, 5, 9]) == "3-6, 9" and ranks([2]) == "2"


def test_the_same_world_gives_each_family_its_own_lambda_and_the_line_says_so():
    assert line(7) == (
        "layout: hardsync, λ = 4 learners (ranks 3-6), 1 shard (rank 0), stats rank 1, data rank 2"
    )
    assert line(7, "protocol.name=sync") == (
        "layout: sync, λ = 5 learners (ranks 2-6), no shard, stats rank 0, data rank 1"
    )


def test_shards_aggregators_and_broadcast_tree():
    got = line(13, "cluster.tree_fanout=4")
    assert got.startswith("layout: hardsync, λ = 8 learners (ranks 4-7, 9-12), 1 shard (rank 0), "
                          "2 aggregators (ranks 3, 8; tree fan-out 4), stats rank 1, data rank 2")
    got = line(8, "cluster.servers=2", "cluster.bcast_fanout=2", "comm.mode=thread")
    assert "2 shards (ranks 0-1)" in got and got.endswith("learner broadcast tree fan-out 2")


@pytest.mark.parametrize(
    "world, overrides, need",
    [
        (7, ["protocol.name=sync", "cluster.learners=4"], 6),
        (6, ["cluster.learners=4"], 7),
        (7, ["protocol.name=adpsgd", "cluster.learners=8"], 10),
    ],
)
def test_a_rank_count_that_does_not_give_the_asked_lambda_names_the_n_that_would(
    world, overrides, need
):
    with pytest.raises(TopologyError) as info:
        make_layout(world, load_config(None, overrides))
    text = str(info.value)
    assert f"needs mpiexec -n {need} " in text and f"run with mpiexec -n {need} " in text
    assert f"not {world} ranks" in text and "\n" not in text
