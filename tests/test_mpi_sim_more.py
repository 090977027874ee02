"""pserver-sim's PP-ASGD, overlapped learners and trees against real runs where a real run is
deterministic (issue 23): one learner, so no other learner's timing decides an arrival order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, train
from test_mpi_sim import same

from pserver.dump.reader import load_dump
from pserver.plan.config import load_config
from pserver.plan.topology import world_size
from pserver.sim.engine import simulate

pytestmark = pytest.mark.mpi



def real_and_simulated(tmp_path: Path, n: int, overrides: list[str]):  # noqa: ANN201
    """test_mpi_sim's pair of runs, at the world size the layout needs (a tree's aggregators)."""
    common = [f"cluster.learners={n}", "run.epochs=1", *overrides]
    cfg = load_config(str(QUICKSTART), [f"run.out_dir={tmp_path / 'sim'}", *common])
    train(tmp_path / "real", world_size(cfg), *common, timeout=300)
    simulate(cfg)
    return load_dump(tmp_path / "real" / "stats.h5"), load_dump(tmp_path / "sim" / "stats.h5")


UPDATES = ("timestamp", "n_gradients", "mean_staleness", "lr", "vector_clock")


def agreeing(tmp_path: Path, n: int, overrides: list[str], least: int):  # noqa: ANN201
    """The pair of runs, with more than ``least`` updates, whose updates (vector clocks
    included) and blocks are identical: what every case below where no timing decides shares."""
    real, sim = real_and_simulated(tmp_path, n, overrides)
    assert real.rows("updates") > least
    same(real, sim, "updates", UPDATES)
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
    return real, sim


def each_round_took_every_learner(dump, n: int) -> None:  # noqa: ANN001
    """Every update applied one gradient of each of the ``n`` learners (the order within a
    round is timing, the set is not)."""
    g = dump.group("gradients")
    for u in np.unique(g["update"]):
        assert sorted(g["learner"][g["update"] == u]) == list(range(n))


def per_learner(dump, column: str) -> list:  # noqa: ANN001
    """(learner, its ``column`` in the ``learners`` rows), sorted."""
    rows = dump.group("learners")
    return sorted(zip(rows["learner"], rows[column], strict=True))

PREDICTED = {
    "async": ["protocol.name=async", "protocol.predict=true"],
    "softsync-fixed-s": ["protocol.name=softsync", "protocol.n=1", "protocol.predict=true",
                         "protocol.predict_steps=2"],
}


@pytest.mark.parametrize("case", sorted(PREDICTED))
def test_pp_asgd_with_one_learner_agrees_exactly(tmp_path, case):
    real, sim = real_and_simulated(tmp_path, 1, PREDICTED[case])
    assert real.rows("predictions") > 50
    same(real, sim, "updates", UPDATES)
    same(real, sim, "gradients", ("learner", "timestamp", "staleness", "update"))
    same(real, sim, "predictions", ("shard", "timestamp", "steps", "staleness_mean"))
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
    same(real, sim, "learners", ("minibatches", "samples"))


#: overlapped runs whose arrival order no timing decides: hardsync and psp wait for each new
#: model (at any λ under hardsync: every round takes every learner), and one async learner
#: with comm.max_inflight = 1 waits for the answer acknowledging its push (serial SGD)
OVERLAPPED = {
    "hardsync-thread": (1, ["protocol.name=hardsync", "comm.mode=thread"]),
    "psp-nonblocking": (1, ["protocol.name=psp", "protocol.c=1", "comm.mode=nonblocking"]),
    "async-inflight-1": (1, ["protocol.name=async", "comm.mode=nonblocking",
                             "comm.max_inflight=1"]),
    "hardsync-4-nonblocking": (4, ["protocol.name=hardsync", "comm.mode=nonblocking"]),
}


@pytest.mark.parametrize("case", sorted(OVERLAPPED))
def test_overlapped_engines_agree_exactly_where_deterministic(tmp_path, case):
    n, overrides = OVERLAPPED[case]
    real, sim = agreeing(tmp_path, n, overrides, 20)
    if n == 1:
        same(real, sim, "gradients", ("learner", "timestamp", "staleness", "update"))
        same(real, sim, "staleness", ("learner", "version", "staleness"))
        same(real, sim, "train", ("learner", "step"))
    else:  # the order within a round is timing: each round took every learner once, σ = 0
        for dump in (real, sim):
            each_round_took_every_learner(dump, n)
            assert np.all(dump.group("gradients")["staleness"] == 0)
    assert per_learner(real, "minibatches") == per_learner(sim, "minibatches")


def test_one_overlapped_async_learner_stays_within_the_window_in_both(tmp_path):
    """With the default window of 2 the order of a reply and the next compute is timing, so
    the runs need not agree row by row; both keep σ ≤ limit − 1 = 1 (pserver.protocols.inflight)
    and take every gradient."""
    real, sim = real_and_simulated(tmp_path, 1, ["protocol.name=async", "comm.mode=thread"])
    for d in (real, sim):
        assert d.group("staleness")["staleness"].max() <= 1
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))


#: the aggregator tree where no timing decides: hardsync's rounds take every learner, each
#: aggregator relays one sum per round (blocking and overlapped learners)
TREES = {
    "hardsync-1": (1, ["protocol.name=hardsync", "cluster.tree_fanout=2"]),
    "hardsync-4": (4, ["protocol.name=hardsync", "cluster.tree_fanout=2"]),
    "hardsync-5-thread": (5, ["protocol.name=hardsync", "cluster.tree_fanout=2",
                              "comm.mode=thread"]),
}


@pytest.mark.parametrize("case", sorted(TREES))
def test_the_aggregator_tree_agrees_exactly_where_deterministic(tmp_path, case):
    n, overrides = TREES[case]
    real, sim = agreeing(tmp_path, n, overrides, 10)  # 85 minibatches in rounds of λ
    nodes = lambda d: sorted(zip(d.group("aggregators")["aggregator"],  # noqa: E731
                                 d.group("aggregators")["rank"], strict=True))
    assert nodes(real) == nodes(sim) and len(nodes(sim)) >= 1  # the real layout's aggregators
    for dump in (real, sim):  # every round: each learner once, relayed through the tree, σ = 0
        each_round_took_every_learner(dump, n)
        assert np.all(dump.group("gradients")["staleness"] == 0)
    assert per_learner(real, "minibatches") == per_learner(sim, "minibatches")


#: the broadcast tree where no timing decides: hardsync's rounds, models relayed down a heap
BCAST = {
    "hardsync-4-thread": (4, ["protocol.name=hardsync", "comm.mode=thread",
                              "cluster.bcast_fanout=2"]),
    "hardsync-4-nonblocking-tree": (4, ["protocol.name=hardsync", "comm.mode=nonblocking",
                                        "cluster.bcast_fanout=2", "cluster.tree_fanout=2"]),
}


@pytest.mark.parametrize("case", sorted(BCAST))
def test_the_broadcast_tree_agrees_exactly_where_deterministic(tmp_path, case):
    n, overrides = BCAST[case]
    real, sim = agreeing(tmp_path, n, overrides, 10)
    for dump in (real, sim):
        each_round_took_every_learner(dump, n)
    assert per_learner(real, "minibatches") == per_learner(sim, "minibatches")
    # the same learners relay, the same models: every round's model to each child once
    assert per_learner(real, "relayed_bytes") == per_learner(sim, "relayed_bytes")
