"""pserver-sim's learners-only strategies against real runs (issue 23), where the real run is
deterministic: SYNC and HYBRID at λ = 1 and λ = 4 (the steps every learner takes, one σ row
per step at versions 0, 1, … — σ = 0 under SYNC, 0 then 1 under HYBRID — one exchange row per
step), ADPSGD refused at λ = 1 by both, and at λ = 4
the same end (the run's M minibatches between the learners, one σ row each) and the same ring
schedule (each sender's partners, each receiver's requests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, run_job, train

from pserver.dump.reader import load_dump
from pserver.plan.config import load_config
from pserver.protocols.lockstep import total_minibatches
from pserver.protocols.ring import Ring
from pserver.sim.engine import simulate

pytestmark = pytest.mark.mpi
TRAIN = 1347  # the digits' training samples (quickstart: test_fraction 0.25)


def real_and_simulated(tmp_path: Path, n: int, overrides: list[str]):  # noqa: ANN201
    common = [f"cluster.learners={n}", "run.epochs=1", *overrides]
    train(tmp_path / "real", n + 2, *common, timeout=300)  # learners, statistics, data
    cfg = load_config(str(QUICKSTART), [f"run.out_dir={tmp_path / 'sim'}", *common])
    simulate(cfg)
    return load_dump(tmp_path / "real" / "stats.h5"), load_dump(tmp_path / "sim" / "stats.h5")


def by_learner_step(dump, group: str, key: str, *columns: str) -> list[tuple]:  # noqa: ANN001
    """The rows of ``group`` as tuples of ``columns``, sorted by (learner, ``key``): a real
    dump interleaves the learners in the order their records reached the statistics server."""
    g = dump.group(group)
    rows = zip(*(g[c].tolist() for c in ("learner", key, *columns)), strict=True)
    return sorted(rows)


@pytest.mark.parametrize("strategy", ["sync", "hybrid"])
@pytest.mark.parametrize("n", [1, 4])
def test_lockstep_strategies_agree_exactly(tmp_path, strategy, n):
    real, sim = real_and_simulated(tmp_path, n, [f"protocol.name={strategy}"])
    assert real.rows("staleness") > 20  # an epoch of the digits: 85 minibatches of 16
    for dump in (real, sim):  # IBM Table 1: SYNC 0, HYBRID 1 (0 for g_0, which lands on w0)
        st = dump.group("staleness")
        for k in range(n):
            sigma = st["staleness"][st["learner"] == k]
            late = 0 if strategy == "sync" else 1
            assert list(sigma) == [0] + [late] * (len(sigma) - 1), (k, sigma[:10])
    assert by_learner_step(real, "staleness", "version", "staleness") == \
        by_learner_step(sim, "staleness", "version", "staleness")
    assert by_learner_step(real, "exchanges", "step", "partner", "bytes") == \
        by_learner_step(sim, "exchanges", "step", "partner", "bytes")
    assert by_learner_step(real, "train", "step") == by_learner_step(sim, "train", "step")
    assert by_learner_step(real, "learners", "minibatches", "samples") == \
        by_learner_step(sim, "learners", "minibatches", "samples")


def test_adpsgd_with_one_learner_is_refused_by_both(tmp_path):
    said = "'adpsgd' needs at least 2 learners, this run has 1"
    res = run_job(3, [str(QUICKSTART), "protocol.name=adpsgd", f"run.out_dir={tmp_path / 'r'}"])
    assert res.returncode == 2 and said in res.stderr
    r = subprocess.run(
        [sys.executable, "-m", "pserver.sim.cli", str(QUICKSTART), "protocol.name=adpsgd",
         "cluster.learners=1", f"run.out_dir={tmp_path / 's'}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert r.returncode == 2 and said in r.stderr


def test_adpsgd_ends_and_follows_the_ring_as_a_real_run(tmp_path):
    real, sim = real_and_simulated(tmp_path, 4, ["protocol.name=adpsgd"])
    cfg = load_config(str(QUICKSTART), ["run.epochs=1"])
    ring = Ring(4)
    for dump in (real, sim):
        learners, ex, st = dump.group("learners"), dump.group("exchanges"), dump.group("staleness")
        assert int(learners["minibatches"].sum()) == total_minibatches(cfg, TRAIN)
        steps = dict(zip(learners["learner"].tolist(), learners["minibatches"].tolist(),
                         strict=True))
        for k in range(4):  # one σ row per gradient, at the versions the book counted
            assert int(np.sum(st["learner"] == k)) == steps[k]
        assert np.all(st["staleness"] >= 0)
        for i in (0, 2):  # senders: one exchange per step, the schedule's partners
            mine = np.flatnonzero(ex["learner"] == i)
            mine = mine[np.argsort(ex["step"][mine], kind="stable")]
            assert list(ex["partner"][mine]) == [ring.partner(i, k) for k in range(steps[i])]
        for j in (1, 3):  # receivers: one row per request of their senders
            asked = sum(1 for i in (0, 2) for k in range(steps[i]) if ring.partner(i, k) == j)
            assert int(np.sum(ex["learner"] == j)) == asked


@pytest.mark.parametrize("strategy", ["bmuf", "ma"])
@pytest.mark.parametrize("n", [1, 4])
def test_local_step_strategies_agree_exactly(tmp_path, strategy, n):
    """BMUF and MA (τ local steps, then the shards' block round): the rounds, their vector
    clocks and learning rates, the models pushed (σ = 0), the blocks' totals and each learner's
    minibatches are the real run's."""
    common = [f"cluster.learners={n}", "run.epochs=2", f"protocol.name={strategy}"]
    train(tmp_path / "real", n + 3, *common, timeout=300)
    simulate(load_config(str(QUICKSTART), [f"run.out_dir={tmp_path / 'sim'}", *common]))
    real, sim = (load_dump(tmp_path / d / "stats.h5") for d in ("real", "sim"))
    assert real.rows("updates") >= 5
    for group, cols in (("updates", ("timestamp", "n_gradients", "mean_staleness", "lr",
                                     "vector_clock")),
                        ("blocks", ("timestamp", "applied", "dropped"))):
        for c in cols:
            a, b = real.group(group)[c], sim.group(group)[c]
            assert np.array_equal(a, b), (group, c, a[:8], b[:8])
    assert by_learner_step(real, "gradients", "timestamp", "staleness", "update") == \
        by_learner_step(sim, "gradients", "timestamp", "staleness", "update")
    assert by_learner_step(real, "learners", "minibatches", "samples") == \
        by_learner_step(sim, "learners", "minibatches", "samples")
    assert by_learner_step(real, "train", "step") == by_learner_step(sim, "train", "step")
