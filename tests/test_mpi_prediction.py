"""PP-ASGD (``protocol.predict``) in real mpiexec runs: λ = 1 equals the serial reference bit for
bit, λ = 4 learns in every comm.mode and transport with a consistent dump, and a refused
combination ends every rank with one line before training."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpirun import QUICKSTART, assert_learned, run_job, train

from learners.data import load_dataset
from learners.serial import train_serial, train_serial_predicted
from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "servers, steps, overrides",
    [
        (1, 0, ("protocol.name=async",)),
        (1, 2, ("protocol.name=async", "protocol.predict_steps=2")),
        (2, 0, ("protocol.name=softsync", "optim.rule=nesterov", "blocks.count=3",
                "comm.staging=always")),
        (1, 0, ("protocol.name=async", "comm.transport=shm")),
        (2, 1, ("protocol.name=ssp", "blocks.count=2", "comm.transport=shm",
                "protocol.predict_steps=1")),
    ],
    ids=["async", "fixed-S2", "nesterov-staged-2-shards", "shm-zero-copy", "shm-2-shards-S1"],
)
def test_one_learner_equals_momentum_sgd_on_the_prediction(tmp_path, servers, steps, overrides):
    """λ = 1, blocking: σ = 0, so the measured S is 0 and the learner's gradient is taken at
    f_0(w) = w + μM; the update path is plain momentum (learners/serial.py)."""
    common = ("run.epochs=2", "optim.weight_decay=0.001", f"cluster.servers={servers}",
              "protocol.predict=true", "protocol.predict_probe=20", *overrides)
    train(tmp_path, servers + 3, *common)
    with h5py.File(tmp_path / "stats.h5", "r") as f:
        w_parallel = f["model/weights"][:]
    cfg = load_config(QUICKSTART, list(common))
    ds = load_dataset(cfg.data, cfg.run.seed)
    np.testing.assert_array_equal(w_parallel, train_serial_predicted(cfg, ds, steps))
    assert not np.allclose(w_parallel, train_serial(cfg, ds), atol=1e-4)  # the prediction counts
    dump = load_dump(tmp_path / "stats.h5")
    assert check_dump(dump) == []
    assert set(dump.group("predictions")["steps"]) == {steps}
    assert len(dump.group("prediction_errors")["error"]) > 0


@pytest.mark.parametrize(
    "overrides",
    [
        ("protocol.name=async",),
        ("protocol.name=async", "comm.mode=nonblocking"),
        ("protocol.name=softsync", "protocol.n=2", "comm.mode=thread"),
        ("protocol.name=ssp",),
        ("protocol.name=psp", "protocol.c=2"),
        ("protocol.name=async", "comm.transport=shm"),
        ("protocol.name=async", "comm.staging=always", "cluster.servers=2", "blocks.count=2"),
        ("protocol.name=async", "cluster.tree_fanout=2"),
        # the per-group tree its bounds were measured on (3 runs, docs/protocols.md); the root
        # tree (issue 25's default) ended at 39.8 % once in a suite run. At the quickstart's
        # α0 = 0.05 prediction through the relays (σ̄ ≈ 12) failed its bound in about 1 run of 5
        # (best 10-24 %, final up to 68 %: it diverged late; 1 of 14 on the code of stop 21,
        # 2-3 of 10 at each of this stop's merge points: not pinned on one change); at 0.025,
        # 14 of 14 ended at 3.1-4.7 %
        ("protocol.name=async", "comm.mode=thread", "cluster.bcast_fanout=2",
         "cluster.bcast_tree=group", "optim.lr=0.025"),
        ("protocol.name=psp", "protocol.pull_fraction=0.5", "blocks.count=2"),
    ],
    ids=["async", "nonblocking", "thread-softsync", "ssp", "psp", "shm", "staged-2-shards",
         "tree", "bcast-tree", "partial-pull"],
)
def test_four_learners_learn_with_prediction(tmp_path, overrides):
    servers = 2 if "cluster.servers=2" in overrides else 1
    aggregators = 2 if "cluster.tree_fanout=2" in overrides else 0
    train(tmp_path, servers + aggregators + 6, "protocol.predict=true", *overrides, timeout=240)
    dump = load_dump(tmp_path / "stats.h5")
    assert check_dump(dump) == []
    if "cluster.bcast_fanout=2" in overrides or "protocol.pull_fraction=0.5" in overrides:
        # σ̄ ≈ 12 through the relaying learners, or half the blocks kept: without prediction
        # these end at best 2.9-4.0 % too (3 runs each); with it 2.2-5.6 % (docs/protocols.md)
        assert_learned(dump, best=0.1, final=0.2)
    elif aggregators:
        # each aggregator sums two learners' gradients: under half the flat run's updates in the
        # 20 epochs, best 2.7-3.1 % with prediction, 2.7-3.3 % without (docs/protocols.md)
        assert_learned(dump, best=0.04)
    else:
        assert_learned(dump)
    p = dump.group("predictions")
    assert len(p["timestamp"]) == len(dump.group("updates")["timestamp"])
    if overrides[0] == "protocol.name=async":  # σ ≈ λ − 1 = 3 here: S measured > 0
        assert p["steps"].max() >= 1 and p["staleness_mean"][-1] > 1.0
    assert len(dump.group("prediction_errors")["error"]) > 0


def test_prediction_refused_with_hardsync_on_every_rank(tmp_path):
    res = run_job(4, [str(QUICKSTART), f"run.out_dir={tmp_path}", "protocol.predict=true"])
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.output.splitlines() if "error:" in ln]
    assert len(lines) == 1 and lines[0].startswith("pserver-run: error: protocol.predict = true")
    assert "Traceback" not in res.output
    assert not (tmp_path / "stats.h5").exists()
