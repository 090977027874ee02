"""Rank layouts, block ownership and trees (pure, no MPI)."""

from __future__ import annotations

import numpy as np
import pytest

from pserver.comm.wire import Header, Tag, WireError, header_buffer
from pserver.errors import ConfigError, TopologyError
from pserver.plan.config import load_config
from pserver.plan.topology import Role, make_layout, split_blocks, tree_size


def test_flat_layout_servers_first():
    lay = make_layout(8, load_config(None, ["cluster.servers=2"]))
    assert lay.servers == (0, 1) and lay.stats == 2 and lay.data == 3
    assert lay.learners == (4, 5, 6, 7)
    assert [lay.role(r) for r in (0, 2, 3, 7)] == [Role.SERVER, Role.STATS, Role.DATA, Role.LEARNER]
    assert lay.describe(5) == "learner 1" and lay.describe(2) == "stats server"
    assert lay.children(None) == (4, 5, 6, 7)
    assert lay.upstream(4, 1) == 1


@pytest.mark.parametrize(
    "world, overrides, fragment",
    [
        (3, [], "run with mpiexec -n 4"),
        (6, ["cluster.learners=4"], "run with mpiexec -n 7 or set cluster.learners=0"),
        (7, ["cluster.tree_fanout=2"], "aggregator(s) (tree_fanout 2)"),
    ],
)
def test_world_size_that_does_not_fit(world, overrides, fragment):
    with pytest.raises(TopologyError, match=None) as info:
        make_layout(world, load_config(None, overrides))
    assert fragment in str(info.value)


def test_tree_layout_depth_first_and_parents():
    lay = make_layout(9, load_config(None, ["cluster.tree_fanout=2"]))
    # server, stats, data, then aggregator 3 with learners 4, 5; aggregator 6 with 7, 8
    assert lay.aggregators == (3, 6) and lay.learners == (4, 5, 7, 8)
    assert lay.parent == {4: 3, 5: 3, 7: 6, 8: 6}
    assert lay.children(None) == (3, 6) and lay.children(3) == (4, 5)
    assert lay.upstream(4, 0) == 3 and lay.upstream(3, 0) == 0
    assert tree_size(1, 2) == 1 and tree_size(4, 2) == 2 and tree_size(5, 2) == 5
    assert tree_size(8, 0) == 0


def leaves_share_nodes(lay, nodes):
    leaves = [a for a in lay.aggregators if all(c in lay.learners for c in lay.children(a))]
    return all(nodes[c] == nodes[a] for a in leaves for c in lay.children(a))


@pytest.mark.parametrize(
    "world, learners, k, nodes",
    [
        (9, 4, 2, [r % 2 for r in range(9)]),  # round-robin placement over 2 nodes
        (15, 9, 3, [r % 3 for r in range(15)]),  # over 3 nodes
        (17, 11, 4, [0] * 7 + [1] * 5 + [2] * 5),  # uneven slots, groups of 5, 5 and 4
        (16, 7, 2, [r % 2 for r in range(16)]),  # three levels of aggregators
    ],
)
def test_tree_leaves_placed_on_their_learners_node(world, learners, k, nodes):
    cfg = load_config(None, [f"cluster.tree_fanout={k}"])
    dfs = make_layout(world, cfg)
    assert not leaves_share_nodes(dfs, nodes)  # rank order alone would split the groups
    lay = make_layout(world, cfg, nodes)
    assert leaves_share_nodes(lay, nodes)
    assert len(lay.learners) == learners and len(lay.aggregators) == len(dfs.aggregators)
    used = sorted([*lay.servers, lay.stats, lay.data, *lay.learners, *lay.aggregators])
    assert used == list(range(world))  # every rank exactly once
    # the same tree shape: each aggregator has as many children as in depth-first order
    assert sorted(len(lay.children(a)) for a in lay.aggregators) == sorted(
        len(dfs.children(a)) for a in dfs.aggregators
    )
    assert make_layout(world, cfg, [0] * world) == dfs  # one node: depth-first order kept


def test_broadcast_tree_heap():
    cfg = load_config(None, ["cluster.bcast_fanout=2", "comm.mode=thread"])
    lay = make_layout(10, cfg)
    assert lay.learners == (3, 4, 5, 6, 7, 8, 9)
    assert lay.bcast_parent == {4: 3, 5: 3, 6: 4, 7: 4, 8: 5, 9: 5}


def test_blocks_by_size_and_by_layer():
    blocks = split_blocks(10, [6, 4], "size", 3, 2)
    assert [(b.start, b.stop, b.shard) for b in blocks] == [(0, 3, 0), (3, 6, 0), (6, 10, 1)]
    blocks = split_blocks(10, [6, 4], "layer", 1, 2)
    assert [(b.start, b.stop, b.shard) for b in blocks] == [(0, 6, 0), (6, 10, 1)]
    covered = np.zeros(1000, int)
    for b in split_blocks(1000, [1000], "size", 7, 3):
        covered[b.start : b.stop] += 1
    assert np.all(covered == 1)
    with pytest.raises(ConfigError, match="cannot feed cluster.servers = 3"):
        split_blocks(10, [10], "size", 2, 3)


def test_header_round_trip_and_unknown_kind():
    buf = header_buffer(1)[0]
    h = Header(Tag.PUSH, 3, 41, 7, 2)
    assert Header.unpack(h.pack(buf)) == h
    buf[0] = 99
    with pytest.raises(WireError, match="unknown message kind 99"):
        Header.unpack(buf)


def test_reply_aux_carries_kind_and_window_version():
    from pserver.comm.wire import Reply, reply_aux, split_reply

    assert split_reply(reply_aux(Reply.WEIGHTS, 5)) == (Reply.WEIGHTS, 5)
    assert split_reply(int(Reply.STOP)) == (Reply.STOP, 0)
    assert str(Header(Tag.REPLY, 0, 3, 1, reply_aux(Reply.WEIGHTS, 2))).endswith("WEIGHTS@v2)")


def test_broadcast_tree_from_the_root_spans_every_aggregator_group():
    """Rudra §III-C: one downcast tree of all learners (``bcast_tree = "root"``, the default);
    ``"group"``: one heap per leaf aggregator (issue 25: the per-group tree was the default)."""
    base = ["protocol.name=async", "cluster.tree_fanout=2", "cluster.bcast_fanout=2",
            "comm.mode=thread"]
    root = make_layout(9, load_config(None, base))
    assert root.learners == (4, 5, 7, 8) and root.parent == {4: 3, 5: 3, 7: 6, 8: 6}
    assert root.bcast_parent == {5: 4, 7: 4, 8: 5}  # only learner 4 pulls from upstream (3)
    group = make_layout(9, load_config(None, [*base, "cluster.bcast_tree=group"]))
    assert group.bcast_parent == {5: 4, 8: 7}  # 4 pulls from 3, 7 from 6
    flat = ["cluster.bcast_fanout=2", "comm.mode=thread"]
    assert (make_layout(10, load_config(None, [*flat, "cluster.bcast_tree=group"])).bcast_parent
            == make_layout(10, load_config(None, flat)).bcast_parent)  # one upstream: one heap
