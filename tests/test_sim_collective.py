"""pserver-sim's learners-only strategies (pserver/sim/collective.py: SYNC, pserver/sim/gossip.py:
ADPSGD), in one process: the run's end and the steps are the real run's pure objects'
(``RunPlan``, ``DataQuota``), σ and the ring's schedule are the real books'
(``ModelVersion``, ``GossipLedger``, ``Ring``), the dump passes ``pserver-stats check``, and the
allreduce's cost is MPICH's algorithms' count of messages."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config
from pserver.protocols.lockstep import ModelVersion, RunPlan, total_minibatches
from pserver.protocols.ring import GossipLedger, Ring
from pserver.sim.collective import allreduce_time
from pserver.sim.costs import Costs
from pserver.sim.engine import model_bytes, simulate

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.toml")
TIMEOUT = 120
TRAIN = 1347  # the digits' training samples (quickstart: test_fraction 0.25)


def config(tmp_path: Path, *overrides: str, name: str = "run"):  # noqa: ANN201
    return load_config(QUICK, [f"run.out_dir={tmp_path / name}", "run.epochs=2",
                               "cluster.learners=4", "sim.compute_cv=0.5", *overrides])


def sim(tmp_path: Path, *overrides: str, name: str = "run"):  # noqa: ANN201
    return load_dump(simulate(config(tmp_path, *overrides, name=name)).dump)


@pytest.mark.parametrize("strategy", ["sync", "hybrid", "adpsgd"])
@pytest.mark.parametrize("n", [2, 5])
def test_a_simulated_dump_passes_the_checks(tmp_path, strategy, n):
    dump = sim(tmp_path, f"protocol.name={strategy}", f"cluster.learners={n}",
               "inject.slow_learner=1", "inject.learner_factor=3")
    assert check_dump(dump) == []
    assert dump.attrs["protocol"] == strategy and "simulated" in dump.attrs
    assert np.all(np.isnan(dump.group("train")["loss"]))
    st, learners = dump.group("staleness"), dump.group("learners")
    assert len(st["staleness"]) == int(learners["minibatches"].sum())  # one σ per gradient
    assert np.all(st["staleness"] >= 0)


def test_pserver_stats_check_reads_both(tmp_path):
    for strategy in ("sync", "adpsgd"):
        d = simulate(config(tmp_path, f"protocol.name={strategy}", name=strategy)).dump
        out = subprocess.run([sys.executable, "-m", "pserver.stats.cli", "check", str(d)],
                             capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        assert out.returncode == 0 and "consistent" in out.stdout, out.stdout + out.stderr


def test_sync_takes_the_run_plans_steps_on_every_learner_at_sigma_zero(tmp_path):
    cfg = config(tmp_path, "protocol.name=sync", "cluster.learners=3")
    steps = RunPlan.from_config(cfg, TRAIN, 3).steps
    dump = load_dump(simulate(cfg).dump)
    learners = dump.group("learners")
    assert list(learners["minibatches"]) == [steps] * 3
    st = dump.group("staleness")
    assert np.all(st["staleness"] == 0)
    for k in range(3):  # version k at step k: one averaged update per step
        assert list(st["version"][st["learner"] == k]) == list(range(steps))
    ex = dump.group("exchanges")
    assert np.all(ex["partner"] == -1) and len(ex["step"]) == 3 * steps


def test_sync_step_is_the_slowest_learner_plus_the_allreduce(tmp_path):
    """No spread, one learner 4× slower: every step lasts its compute plus the allreduce."""
    over = ["protocol.name=sync", "cluster.learners=4", "sim.compute_cv=0", "sim.compute=0.002",
            "inject.slow_learner=2", "inject.learner_factor=4", "run.epochs=1"]
    cfg = config(tmp_path, *over)
    steps = RunPlan.from_config(cfg, TRAIN, 4).steps
    nbytes, _ = model_bytes(cfg)
    reduce = allreduce_time(Costs.from_config(cfg, nbytes), 4, cfg.comm.bucket_mib)
    assert reduce > 0
    out = simulate(cfg)
    assert out.sim_time == pytest.approx(steps * (0.008 + reduce), rel=1e-9)
    train = load_dump(out.dump).group("train")
    fast = train["learner"] != 2  # the others wait for the slow one: 3 × 2 ms + the sum
    assert np.allclose(train["push_time"][fast], 0.006 + reduce)
    assert np.allclose(train["push_time"][~fast], reduce)


def test_hybrid_applies_each_gradient_a_step_late(tmp_path):
    cfg = config(tmp_path, "protocol.name=hybrid", "cluster.learners=3")
    steps = RunPlan.from_config(cfg, TRAIN, 3).steps
    dump = load_dump(simulate(cfg).dump)
    assert list(dump.group("learners")["minibatches"]) == [steps] * 3
    st = dump.group("staleness")
    for k in range(3):  # g_k computed on version k - 1 (g_0 on w0), applied as update k
        mine = st["learner"] == k
        assert list(st["version"][mine]) == [0, *range(steps - 1)]
        assert list(st["staleness"][mine]) == [0] + [1] * (steps - 1)


def test_allreduce_time_counts_mpichs_messages(tmp_path):
    cfg = load_config(QUICK, ["sim.latency=1e-5", "sim.bandwidth=1e8"])
    costs = Costs.from_config(cfg, 1000)  # a short message: recursive doubling
    msg = 1e-5 + 1000 / 1e8
    assert allreduce_time(costs, 1, 16.0) == 0.0
    assert allreduce_time(costs, 8, 16.0) == pytest.approx(3 * msg)
    assert allreduce_time(costs, 6, 16.0) == pytest.approx((2 + 2) * msg)  # 4 + 2 folded in
    big = replace(costs, nbytes=8_000_000)  # Rabenseifner: 2 log p α + 2 (p-1)/p n/β
    assert allreduce_time(big, 8, 16.0) == pytest.approx(6e-5 + 2 * 7 / 8 * 8e6 / 1e8)
    # 1 MiB buckets: 8 of them, each with its own latencies
    per = 6e-5 + 2 * 7 / 8 * 2**20 / 1e8
    assert allreduce_time(replace(costs, nbytes=8 * 2**20), 8, 1.0) == pytest.approx(8 * per)


def test_adpsgd_serves_the_runs_minibatches_and_follows_the_ring(tmp_path):
    cfg = config(tmp_path, "protocol.name=adpsgd", "cluster.learners=6",
                 "inject.slow_learner=3", "inject.learner_factor=5")
    dump = load_dump(simulate(cfg).dump)
    learners, ex = dump.group("learners"), dump.group("exchanges")
    assert int(learners["minibatches"].sum()) == total_minibatches(cfg, TRAIN)  # DataQuota FREE
    ring = Ring(6)
    steps = dict(zip(learners["learner"].tolist(), learners["minibatches"].tolist(), strict=True))
    for i in range(0, 6, 2):  # a sender: one exchange per step, partners left, right, …
        mine = ex["learner"] == i
        assert list(ex["partner"][mine]) == [ring.partner(i, k) for k in range(steps[i])]
        assert list(ex["step"][mine]) == list(range(1, steps[i] + 1))
    for j in range(1, 6, 2):  # a receiver: one row per request its two senders sent it
        asked = sum(1 for i in range(0, 6, 2) for k in range(steps[i]) if ring.partner(i, k) == j)
        assert int(np.sum(ex["learner"] == j)) == asked
    # the slow receiver's senders waited for it: it computes 5× longer, yet answers promptly
    assert steps[3] < steps[2]


def test_adpsgd_sigma_is_the_ledgers():
    """The book both the real and the simulated exchange keep: σ counts the averages mixed in
    between the snapshot and the update; the neighbour model's age, its steps behind ours."""
    book = GossipLedger(Ring(4), 1)
    book.snapshot()
    assert book.gradient() == (0, 0)
    assert book.stepped() is None  # a receiver starts no exchange
    book.snapshot()
    assert book.mixed(0, [0, 0, 0, 0]) == (1, 1)  # our step 1, theirs 0: age 1
    assert book.mixed(3, [3, 0, 2, 0]) == (1, 0)
    assert book.gradient() == (1, 2) and book.clock.steps == [3, 1, 2, 0]
    sender = GossipLedger(Ring(4), 0)
    assert [sender.stepped() for _ in range(3)] == [3, 1, 3]  # left, right, left
    v = ModelVersion()
    assert [v.applied(v.value) for _ in range(3)] == [0, 0, 0] and v.value == 3
    assert v.applied(2) == 1  # HYBRID: computed before the previous average landed


def test_adpsgd_beats_sync_with_a_straggler_in_simulated_time(tmp_path):
    """One learner 20× slower: SYNC's every step waits for it, ADPSGD's ring does not."""
    over = ["cluster.learners=16", "inject.slow_learner=5", "inject.learner_factor=20",
            "sim.compute=0.002"]
    rate = {}
    for s in ("sync", "adpsgd"):
        out = simulate(config(tmp_path, f"protocol.name={s}", *over, name=s))
        rate[s] = int(load_dump(out.dump).group("learners")["samples"].sum()) / out.sim_time
    assert rate["adpsgd"] > 5 * rate["sync"]


@pytest.mark.parametrize(("n", "says"), [
    (1, "protocol.name = 'adpsgd' needs at least 2 learners, this run has 1"),
])
def test_adpsgd_with_one_learner_is_refused_as_a_real_run_is(tmp_path, n, says):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "pserver.sim.cli", QUICK, f"run.out_dir={out}",
         "protocol.name=adpsgd", f"cluster.learners={n}"],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert says in r.stderr and not out.exists()


def test_the_feed_ends_sync_at_the_plan_even_with_prefetch(tmp_path):
    """λ = 7 does not divide M: S·λ ≥ M minibatches, every learner S of them (the quota)."""
    cfg = config(tmp_path, "protocol.name=sync", "cluster.learners=7", "data.prefetch=3")
    m = total_minibatches(cfg, TRAIN)
    s = math.ceil(m / 7)
    dump = load_dump(simulate(cfg).dump)
    assert list(dump.group("learners")["minibatches"]) == [s] * 7


@pytest.mark.parametrize("strategy", ["bmuf", "ma"])
def test_local_step_strategies_push_once_per_block(tmp_path, strategy):
    """BMUF and MA: a learner pushes its model once per τ minibatches (σ = 0: every block
    starts from the global model), the shard's rounds take one model of every learner."""
    dump = sim(tmp_path, f"protocol.name={strategy}", "protocol.tau=4")
    assert check_dump(dump) == []
    g, learners = dump.group("gradients"), dump.group("learners")
    assert np.all(g["staleness"] == 0)
    for k, mb in zip(learners["learner"], learners["minibatches"], strict=True):
        assert int(np.sum(g["learner"] == k)) == mb // 4
    up = dump.group("updates")
    assert np.all(up["n_gradients"] == 4)
