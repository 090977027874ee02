"""Real mpiexec runs on the digits set: staleness, accuracy and the serial reference."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpirun import QUICKSTART, assert_learned, train

from learners.data import load_dataset
from learners.serial import train_serial
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config

pytestmark = pytest.mark.mpi

# Emulated per-minibatch compute (the learners sleep) so that four learners are really in flight
# at once on two cores, as on a cluster; without it the learners run one after another and the
# staleness of softsync collapses towards 0.
COMPUTE = "inject.compute_time=0.003"


def staleness(tmp_path):
    dump = load_dump(tmp_path / "stats.h5")
    g = dump.group("gradients")
    return dump, g["staleness"][g["update"] >= 0]


def test_hardsync_four_learners_zero_staleness_and_accuracy(tmp_path):
    train(tmp_path, 7, "protocol.name=hardsync")
    dump, sigma = staleness(tmp_path)
    assert sigma.size > 1000
    assert np.all(sigma == 0)
    assert np.all(dump.group("updates")["n_gradients"] == 4)
    clocks = dump.group("updates")["vector_clock"]
    assert np.all(clocks[:, :4] == (dump.group("updates")["timestamp"] - 1)[:, None])
    assert_learned(dump)


def test_one_softsync_staleness_near_one_and_accuracy(tmp_path):
    train(tmp_path, 7, "protocol.name=softsync", "protocol.n=1", COMPUTE)
    dump, sigma = staleness(tmp_path)
    assert 0.5 <= sigma.mean() <= 1.5
    assert np.mean(sigma <= 2) >= 0.99
    assert_learned(dump)
    mean_eq2 = dump.group("updates")["mean_staleness"]
    assert abs(mean_eq2.mean() - sigma.mean()) < 1e-9  # c gradients per update: same mean


def test_async_staleness_near_lambda(tmp_path):
    train(tmp_path, 7, "protocol.name=async", "run.epochs=5", COMPUTE)
    _, sigma = staleness(tmp_path)
    assert 2.0 <= sigma.mean() <= 6.0
    assert sigma.max() <= 2 * 4 * 2  # Rudra Fig. 3: bounded near 2n


@pytest.mark.parametrize(
    "servers, overrides",
    [
        (1, ("protocol.name=hardsync",)),
        (1, ("protocol.name=softsync", "protocol.lr_policy=per-gradient")),
        (1, ("protocol.name=async", "optim.rule=adagrad", "optim.lr=0.05")),
        (1, ("protocol.name=softsync", "optim.rule=nesterov", "blocks.count=3")),
        (2, ("protocol.name=hardsync", "blocks.count=2")),
        (3, ("protocol.name=async", "blocks.split=layer")),
        (3, ("protocol.name=softsync", "optim.rule=adagrad", "blocks.count=5")),
        (2, ("protocol.name=hardsync", "blocks.count=2", "comm.staging=always")),
        (1, ("protocol.name=async", "optim.lr_milestones=[1]", "optim.lr_gamma=0.2")),
        (1, ("protocol.name=async", "optim.warmup_epochs=0.5", "optim.warmup_start=0.1",
             "optim.lr_decay=0.7")),
    ],
    ids=["hardsync", "softsync-per-gradient", "async-adagrad", "nesterov-3-blocks",
         "2-shards-hardsync", "3-shards-async-by-layer", "3-shards-softsync-adagrad",
         "host-staging-path", "async-step-decay", "async-warmup-anneal"],
)
def test_one_learner_reproduces_serial_sgd(tmp_path, servers, overrides):
    common = ("run.epochs=2", "optim.weight_decay=0.001", f"cluster.servers={servers}", *overrides)
    train(tmp_path, servers + 3, *common)
    with h5py.File(tmp_path / "stats.h5", "r") as f:
        w_parallel = f["model/weights"][:]
    cfg = load_config(QUICKSTART, list(common))
    w_serial = train_serial(cfg, load_dataset(cfg.data, cfg.run.seed))
    assert w_parallel.shape == w_serial.shape
    assert not np.allclose(w_serial, cfg_init(cfg))  # training moved the weights
    np.testing.assert_allclose(w_parallel, w_serial, rtol=1e-5, atol=1e-6)


def cfg_init(cfg):
    from learners.models import build_model

    ds = load_dataset(cfg.data, cfg.run.seed)
    return build_model(cfg.model, ds.n_features, ds.n_classes).init_params(cfg.run.seed)
