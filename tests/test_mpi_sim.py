"""pserver-sim against real runs where a real run is deterministic (issue 23): with one learner
under every simulated strategy, the sequence of updates (timestamps, vector clocks, ⟨σ⟩, the
learning rate), of gradients (timestamp, σ, the update each entered) and the end-of-run counts
are the same; under hardsync with 4 learners, so are the rounds and their vector clocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, train

from pserver.dump.reader import load_dump
from pserver.plan.config import load_config
from pserver.sim.engine import simulate

pytestmark = pytest.mark.mpi

ONE = {
    "async": ["protocol.name=async"],
    "softsync": ["protocol.name=softsync", "protocol.n=1"],
    "hardsync": ["protocol.name=hardsync"],
    "psp": ["protocol.name=psp", "protocol.c=1"],
    "ssp": ["protocol.name=ssp", "protocol.s=1"],
}


def real_and_simulated(tmp_path: Path, n: int, overrides: list[str]):  # noqa: ANN201
    common = [f"cluster.learners={n}", "run.epochs=1", *overrides]
    train(tmp_path / "real", n + 3, *common, timeout=300)
    cfg = load_config(str(QUICKSTART), [f"run.out_dir={tmp_path / 'sim'}", *common])
    simulate(cfg)
    return load_dump(tmp_path / "real" / "stats.h5"), load_dump(tmp_path / "sim" / "stats.h5")


def same(real, sim, group: str, columns: tuple[str, ...]) -> None:  # noqa: ANN001
    for col in columns:
        a, b = real.group(group)[col], sim.group(group)[col]
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-12, err_msg=f"{group}/{col}")
        else:
            assert np.array_equal(a, b), (group, col, a[:10], b[:10])


@pytest.mark.parametrize("strategy", sorted(ONE))
def test_one_learner_agrees_exactly(tmp_path, strategy):
    real, sim = real_and_simulated(tmp_path, 1, ONE[strategy])
    assert real.rows("updates") > 50  # an epoch of the digits: 85 minibatches of 16
    same(real, sim, "updates", ("timestamp", "n_gradients", "mean_staleness", "lr",
                                "vector_clock"))
    same(real, sim, "gradients", ("learner", "timestamp", "staleness", "update"))
    same(real, sim, "staleness", ("learner", "version", "staleness"))
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
    same(real, sim, "learners", ("minibatches", "samples"))
    same(real, sim, "train", ("learner", "step"))


def test_hardsync_rounds_and_vector_clocks_agree_at_four_learners(tmp_path):
    real, sim = real_and_simulated(tmp_path, 4, ["protocol.name=hardsync"])
    same(real, sim, "updates", ("timestamp", "n_gradients", "mean_staleness", "lr",
                                "vector_clock"))
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
    for dump in (real, sim):  # each round took one gradient of every learner, σ = 0
        g = dump.group("gradients")
        applied = g["update"] != -1
        for u in np.unique(g["update"][applied]):
            assert sorted(g["learner"][g["update"] == u]) == [0, 1, 2, 3]
        assert np.all(g["staleness"][applied] == 0)
    rounds = lambda d: sorted(zip(d.group("learners")["learner"],  # noqa: E731
                                  d.group("learners")["minibatches"], strict=True))
    assert rounds(real) == rounds(sim)
