"""ADPSGD (protocol.name = "adpsgd") on real runs: bad input refused before training; λ = 4
on the quickstart model for 20 epochs learns as the parameter-server protocols do, in every
``comm.mode``, with a dump that has exactly the schema and passes ``pserver-stats check``."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpirun import QUICKSTART, assert_learned, run_job

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.dump.schema import GROUPS, MODEL_WEIGHTS
from pserver.plan.config import load_config
from pserver.protocols.lockstep import total_minibatches
from pserver.protocols.ring import Ring

pytestmark = pytest.mark.mpi

CONFIG = """
[run]
seed = 0
epochs = 1
[protocol]
name = "adpsgd"
[cluster]
servers = 0
[model]
kind = "mlp"
hidden = [16]
[data]
source = "digits"
batch_size = 16
"""


def write_config(tmp_path):  # noqa: ANN001, ANN201 - Path -> Path
    path = tmp_path / "adpsgd.toml"
    path.write_text(CONFIG)
    return path


def test_one_learner_is_refused_on_every_rank(tmp_path):
    res = run_job(3, [str(write_config(tmp_path)), f"run.out_dir={tmp_path / 'out'}"], 120)
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1, res.output
    assert "'adpsgd' needs at least 2 learners, this run has 1" in lines[0]
    assert "Traceback" not in res.output


def test_server_shards_are_refused(tmp_path):
    args = [str(write_config(tmp_path)), f"run.out_dir={tmp_path / 'out'}", "cluster.servers=1"]
    res = run_job(5, args, 120)
    assert res.returncode == 2, res.output
    assert "runs without parameter-server shards; set cluster.servers = 0" in res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize("mode", ["thread", "nonblocking", "blocking"])
def test_four_learners_learn_with_a_consistent_dump(tmp_path, mode):
    out = tmp_path / "out"
    res = run_job(6, [str(QUICKSTART), 'protocol.name="adpsgd"', f"run.out_dir={out}",
                      "stats.progress=false", f"comm.mode={mode}"], 300)  # fmt: skip
    assert res.returncode == 0, res.output
    dump = load_dump(out / "stats.h5")
    assert_learned(dump)
    assert not check_dump(dump), check_dump(dump)
    assert dump.group("test")["epoch"].tolist() == list(range(1, 21))  # every epoch tested
    with h5py.File(out / "stats.h5", "r") as f:
        for name in (k for k in f if k != "model"):
            g = GROUPS[name]
            assert {k: str(f[name][k].dtype) for k in f[name]} == {
                c.name: c.dtype for c in (*g.columns, *g.clocks)}, name  # fmt: skip
        assert f[MODEL_WEIGHTS].shape == (4810,)
    # the data server ended the run after exactly the serial reference's minibatches
    learners = dump.group("learners")
    train_size = int(dump.group("test")["samples"][0])  # samples of one epoch
    cfg = load_config(None, ["run.epochs=20", "data.batch_size=16"])
    assert int(learners["minibatches"].sum()) == total_minibatches(cfg, train_size)
    # every exchange is with a ring neighbour; partner_age is the partner model's age
    ex = dump.group("exchanges")
    ring = Ring(4)
    assert len(ex["learner"]) > 0 and set(ex["learner"].tolist()) == {0, 1, 2, 3}
    for i, j in zip(ex["learner"].tolist(), ex["partner"].tolist(), strict=True):
        assert j in ring.neighbours(i)
    assert np.array_equal(ex["partner_age"], np.maximum(0, ex["step"] - ex["partner_step"]))
    # σ (docs/stats.md): one row per applied gradient, the averages mixed in meanwhile
    st = dump.group("staleness")
    assert len(st["staleness"]) == int(learners["minibatches"].sum())
    assert np.array_equal(st["owner"], st["learner"]) and np.all(st["staleness"] >= 0)
    # each exchange is recorded once by the sender and once by the receiver
    senders = np.isin(ex["learner"], [0, 2])
    assert senders.sum() == (~senders).sum()


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_random_runs_with_injected_delays_end_cleanly(tmp_path, n):
    """A handful of one-epoch trainings with drawn comm.mode, compute time and straggler
    (``scripts/soak_gossip.py --cli`` draws 50 for the note): each ends (hard timeout), exits
    0 and writes a consistent dump with the run's M minibatches and its epoch tested."""
    import random
    import sys

    sys.path.insert(0, str(QUICKSTART.parents[1] / "scripts"))
    from soak_gossip import cli_run, draw_cli

    rng = random.Random(1000 + n)
    while (drawn := draw_cli(rng))[0] != n:
        pass
    what, _, why = cli_run(n, drawn[1], tmp_path, 240)
    assert what == "ok", (drawn, why)
