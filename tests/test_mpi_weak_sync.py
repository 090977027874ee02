"""Real mpiexec runs of the weak-synchronization protocols (PSP-SGD Algorithm 1, SSP)."""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import train

from pserver.dump.reader import load_dump

pytestmark = pytest.mark.mpi

COMPUTE = "inject.compute_time=0.003"


def test_partial_push_drops_exactly_the_late_gradients(tmp_path):
    train(tmp_path, 7, "protocol.name=psp", "protocol.c=2", "run.epochs=3", COMPUTE)
    dump = load_dump(tmp_path / "stats.h5")
    g, u = dump.group("gradients"), dump.group("updates")
    accepted, dropped = g["update"] >= 0, g["update"] < 0
    assert dropped.sum() > 0  # with c = 2 of 4 the two slowest of each round miss it
    assert np.all(g["staleness"][accepted] == 0)  # Algorithm 1 line 7: only t' = t enters
    assert np.all(g["staleness"][dropped] > 0)  # ... and everything dropped was late
    assert np.all((u["n_gradients"] >= 2) & (u["n_gradients"] <= 4))
    assert u["n_gradients"].sum() == accepted.sum()  # every accepted gradient is in an update
    for ts, n in zip(u["timestamp"], u["n_gradients"], strict=True):
        assert np.sum(g["update"] == ts) == n  # ... the one the dump names
    blocks = dump.group("blocks")
    assert blocks["dropped"].sum() == dropped.sum()
    pushes = dump.group("learners")["minibatches"].sum()
    assert (
        accepted.sum() + dropped.sum() + dump.group("servers")["dropped_after_stop"].sum() == pushes
    )


def test_partial_pull_keeps_training_past_a_slow_shard(tmp_path):
    train(
        tmp_path,
        8,
        "protocol.name=psp",
        "protocol.c=3",
        "protocol.pull_fraction=0.5",
        "cluster.servers=2",
        "blocks.count=4",
        "inject.slow_server=1",
        "inject.server_factor=30",
        "run.epochs=3",
        COMPUTE,
        timeout=180,
    )
    dump = load_dump(tmp_path / "stats.h5")
    stale = dump.group("train")["stale_fraction"]
    assert stale.max() > 0  # some iterations computed with kept copies of the slow shard's blocks
    assert dump.group("test")["epoch"][-1] == 3
    blocks = dump.group("blocks")
    fast = blocks["timestamp"][blocks["shard"] == 0]
    assert np.all(fast > 0)


def test_injected_pull_delays_are_recorded_and_deterministic(tmp_path):
    args = (
        "protocol.name=async",
        "inject.pull_delay_prob=0.1",
        "inject.pull_delay=0.02",
        "run.epochs=2",
        COMPUTE,
    )
    train(tmp_path / "a", 5, *args)
    train(tmp_path / "b", 5, *args)
    da, db = (load_dump(tmp_path / x / "stats.h5").group("delays") for x in "ab")
    assert np.all(da["delay"] == 0.02)

    def early(d):  # the delayed (learner, pull index) pairs among every learner's first 40 pulls
        return {
            (int(lr), int(r)) for lr, r in zip(d["learner"], d["request"], strict=True) if r < 40
        }

    assert len(early(da)) >= 2
    assert early(da) == early(db)  # a function of (seed, shard, learner, pull index) only


def test_ssp_bounds_how_far_learners_run_apart(tmp_path):
    train(
        tmp_path,
        7,
        "protocol.name=ssp",
        "protocol.s=2",
        "inject.slow_learner=0",
        "inject.learner_factor=4",
        "run.epochs=2",
        COMPUTE,
    )
    dump = load_dump(tmp_path / "stats.h5")
    g = dump.group("gradients")
    order = np.argsort(g["time"], kind="stable")
    clocks = np.zeros(4, dtype=int)
    spread = 0
    for learner in g["learner"][order]:
        clocks[learner] += 1
        spread = max(spread, clocks.max() - clocks.min())
    assert spread <= 2 + 2  # s, plus the gradient in flight on each side of the bound
    assert dump.group("learners")["minibatches"].min() > 0


def test_computed_epoch_basis_counts_dropped_gradients(tmp_path):
    train(
        tmp_path,
        7,
        "protocol.name=psp",
        "protocol.c=2",
        "run.epochs=2",
        "run.epoch_basis=computed",
        COMPUTE,
    )
    dump = load_dump(tmp_path / "stats.h5")
    g = dump.group("gradients")
    needed = int(np.ceil(2 * 1347 / 16))  # digits train split: 1347 samples, batch 16
    assert np.sum(g["update"] < 0) > 0
    assert needed <= g["update"].size <= needed + 4  # applied + dropped, plus a round in flight
