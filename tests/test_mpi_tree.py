"""Rudra-adv's aggregator tree (cluster.tree_fanout) in real mpiexec runs."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpirun import QUICKSTART, train

from learners.data import load_dataset
from learners.serial import train_serial
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("servers, staging", [(1, "auto"), (2, "always")])
def test_one_learner_under_an_aggregator_reproduces_serial_sgd(tmp_path, servers, staging):
    """Hardsync only: with softsync an aggregator answers from its cache, one update behind."""
    common = ("run.epochs=2", "protocol.name=hardsync", "cluster.tree_fanout=2",
              f"cluster.servers={servers}", "blocks.count=2", "optim.rule=adagrad",
              f"comm.staging={staging}")
    train(tmp_path, servers + 4, *common)  # shards, stats, data, one aggregator, one learner
    dump = load_dump(tmp_path / "stats.h5")
    assert dump.group("aggregators")["bytes_in"][0] > 0  # the traffic went through it
    with h5py.File(tmp_path / "stats.h5", "r") as f:
        w_parallel = f["model/weights"][:]
    cfg = load_config(QUICKSTART, list(common))
    w_serial = train_serial(cfg, load_dataset(cfg.data, cfg.run.seed))
    np.testing.assert_allclose(w_parallel, w_serial, rtol=1e-5, atol=1e-6)


def ingress_per_gradient(path):
    dump = load_dump(path / "stats.h5")
    applied = int(np.sum(dump.group("gradients")["update"] >= 0))
    return dump, dump.group("servers")["bytes_in"].sum() / applied


def test_tree_halves_root_ingress_and_keeps_clocks_exact(tmp_path):
    train(tmp_path / "flat", 7, "protocol.name=hardsync", "run.epochs=3")
    train(tmp_path / "tree", 9, "protocol.name=hardsync", "run.epochs=3", "cluster.tree_fanout=2")
    _, flat = ingress_per_gradient(tmp_path / "flat")
    dump, tree = ingress_per_gradient(tmp_path / "tree")
    assert tree <= 0.55 * flat  # two sums of two gradients instead of four gradients
    g, u = dump.group("gradients"), dump.group("updates")
    assert np.all(g["staleness"] == 0)
    assert np.all(u["n_gradients"] == 4)
    assert np.all(u["vector_clock"] == (u["timestamp"] - 1)[:, None])
    assert sorted(set(g["learner"].tolist())) == [0, 1, 2, 3]
    assert dump.group("test")["error"][-1] <= 0.1  # 3 epochs; accuracy is tested at 20


def test_async_tree_vector_clocks_consistent(tmp_path):
    train(tmp_path, 9, "protocol.name=async", "run.epochs=2", "cluster.tree_fanout=2",
          "inject.compute_time=0.002")
    dump = load_dump(tmp_path / "stats.h5")
    u = dump.group("updates")
    clocks = u["vector_clock"]
    assert np.all((clocks < u["timestamp"][:, None]) | (clocks == -1))
    assert np.all(u["n_gradients"] >= 2)  # every relayed sum holds a gradient per child
    assert dump.attrs["finished"]
