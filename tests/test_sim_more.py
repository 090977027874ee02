"""pserver-sim's PP-ASGD, overlapped learners and trees (pserver/sim/predict.py, overlap.py,
tree.py): the simulated dump passes the dump's checks and holds what the real objects decide.
No MPI (tests/test_mpi_sim_more.py compares with real runs)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.optim.prediction import WINDOW
from pserver.plan.config import load_config
from pserver.sim.engine import simulate

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.toml")


def sim(tmp_path: Path, *overrides: str, name: str = "run", n: int = 8) -> Path:
    cfg = load_config(QUICK, [f"run.out_dir={tmp_path / name}", "run.epochs=2",
                              f"cluster.learners={n}", "sim.compute_cv=0.5", *overrides])
    return simulate(cfg).dump


# -- PP-ASGD (pserver/sim/predict.py) ---------------------------------------------------------

PREDICTED = {
    "async": ["protocol.name=async"],
    "softsync": ["protocol.name=softsync", "protocol.n=2"],
    "ssp": ["protocol.name=ssp", "protocol.s=2"],
    "psp": ["protocol.name=psp", "protocol.c=4", "protocol.tau1=0.0005"],
}


@pytest.mark.parametrize("strategy", sorted(PREDICTED))
def test_pp_asgd_writes_one_prediction_per_update_with_the_measured_s(tmp_path, strategy):
    d = load_dump(sim(tmp_path, *PREDICTED[strategy], "protocol.predict=true"))
    assert check_dump(d) == []
    up, pr = d.group("updates"), d.group("predictions")
    assert np.array_equal(pr["timestamp"], up["timestamp"]) and np.all(pr["shard"] == 0)
    # S̄ is the running mean of the last WINDOW updates' ⟨σ⟩, S = ⌊S̄⌋ (Sato et al. eq. (2))
    sigma = up["mean_staleness"]
    want = np.array([sigma[max(0, i + 1 - WINDOW):i + 1].mean() for i in range(len(sigma))])
    np.testing.assert_allclose(pr["staleness_mean"], want, rtol=1e-12)
    assert np.array_equal(pr["steps"], [max(0, math.floor(m)) for m in want])
    assert d.rows("prediction_errors") == 0  # the probes measure weights: not simulated
    if strategy != "psp":
        assert pr["steps"].max() >= 1  # stale gradients: something was predicted


def test_pp_asgd_with_a_fixed_s_serves_it_at_every_update(tmp_path):
    d = load_dump(sim(tmp_path, "protocol.name=async", "protocol.predict=true",
                      "protocol.predict_steps=3"))
    assert check_dump(d) == []
    assert np.all(d.group("predictions")["steps"] == 3)


def test_prediction_changes_no_time_nor_message(tmp_path):
    """A reply carries f_S(w, M) instead of w in the same message: the run is the host's."""
    plain = load_dump(sim(tmp_path, "protocol.name=async", name="plain"))
    pred = load_dump(sim(tmp_path, "protocol.name=async", "protocol.predict=true", name="pred"))
    for group, cols in (("updates", ("timestamp", "time", "mean_staleness", "vector_clock")),
                        ("gradients", ("learner", "timestamp", "staleness", "time"))):
        for c in cols:
            assert np.array_equal(plain.group(group)[c], pred.group(group)[c]), (group, c)
    assert plain.rows("predictions") == 0


# -- the overlapped engines (pserver/sim/overlap.py) ------------------------------------------

OVERLAPPED = {
    "async": ["protocol.name=async"],
    "softsync": ["protocol.name=softsync", "protocol.n=2"],
    "hardsync": ["protocol.name=hardsync"],
    "psp": ["protocol.name=psp", "protocol.c=4", "protocol.tau1=0.0005"],
}


@pytest.mark.parametrize("mode", ["nonblocking", "thread"])
@pytest.mark.parametrize("strategy", sorted(OVERLAPPED))
def test_an_overlapped_run_is_consistent(tmp_path, strategy, mode):
    d = load_dump(sim(tmp_path, *OVERLAPPED[strategy], f"comm.mode={mode}",
                      "inject.freeze_learner=1", "inject.freeze_step=5",
                      "inject.freeze_time=0.02"))
    assert check_dump(d) == []
    assert d.group("blocks")["applied"][0] * 16 >= 2 * 1347  # the epochs were trained
    lr = d.group("learners")
    assert np.all(lr["push_time"] >= 0) and np.all(lr["overlap"] <= 1.0)
    if strategy in ("hardsync", "psp"):  # each minibatch waits for the next model: σ = 0
        assert np.all(d.group("staleness")["staleness"] == 0)


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_one_overlapped_learner_runs_at_most_the_bound_ahead(tmp_path, limit):
    """pserver.protocols.inflight: with λ = 1 nothing else updates the weights, so σ ≤ limit − 1;
    with a round trip (10 ms) longer than a compute (1 ms) the learner runs that far ahead; with
    a short one (0.1 ms) each answer is installed at the next minibatch, σ ≤ 1."""
    common = ("protocol.name=async", "comm.mode=nonblocking", f"comm.max_inflight={limit}",
              "sim.compute_cv=0")
    far = load_dump(sim(tmp_path, *common, "sim.latency=0.005", n=1, name="far"))
    near = load_dump(sim(tmp_path, *common, n=1, name="near"))
    assert check_dump(far) == [] and check_dump(near) == []
    assert far.group("staleness")["staleness"].max() == limit - 1
    assert near.group("staleness")["staleness"].max() == min(limit - 1, 1)


def test_the_overlap_adds_at_most_a_window_of_staleness(tmp_path):
    """Equal learners under async: blocking gives σ = λ − 1 (Rudra §V-A); overlapped with the
    window of 2 every learner has two pushes unacknowledged, so 2λ − 1 updates come between a
    gradient's weights and its own update: within the backlog bound λ·limit of
    pserver.protocols.inflight (Rudra's σ ≤ 2n, n = λ under async)."""
    block = load_dump(sim(tmp_path, "protocol.name=async", "sim.compute_cv=0", name="b"))
    over = load_dump(sim(tmp_path, "protocol.name=async", "sim.compute_cv=0",
                         "comm.mode=thread", name="o"))
    sb, so = block.group("staleness")["staleness"], over.group("staleness")["staleness"]
    assert np.mean(sb[20:]) == 7.0
    assert np.mean(so[20:]) == 15.0 and so.max() <= 16


def test_overlapped_learners_share_the_cores(tmp_path):
    """sim.cores: their model compute and step CPU queue for the node's cores (as blocking
    learners' do): fewer cores, a longer run, the same protocol."""
    runs = {c: load_dump(sim(tmp_path, "protocol.name=hardsync", "comm.mode=thread",
                             "sim.compute=0.002", f"sim.cores={c}", name=f"c{c}"))
            for c in (1, 8)}  # fmt: skip
    for d in runs.values():
        assert check_dump(d) == []
        assert np.all(d.group("learners")["cpu_time"] > 0)
    assert runs[1].attrs["wall_time"] > 2 * runs[8].attrs["wall_time"]
    assert runs[1].rows("updates") == runs[8].rows("updates")


def test_overlap_refuses_what_it_does_not_model(tmp_path):
    from pserver.errors import ConfigError

    with pytest.raises(ConfigError, match="sim.polls"):
        sim(tmp_path, "protocol.name=async", "comm.mode=thread", "sim.polls=true")


# -- the aggregator tree (pserver/sim/tree.py) ------------------------------------------------

TREES = {
    "async": ["protocol.name=async"],
    "softsync": ["protocol.name=softsync", "protocol.n=2"],
    "hardsync": ["protocol.name=hardsync"],
}


@pytest.mark.parametrize("mode", ["blocking", "thread"])
@pytest.mark.parametrize("fanout", [2, 3])
@pytest.mark.parametrize("strategy", sorted(TREES))
def test_a_tree_run_is_consistent_and_relays_whole_rounds(tmp_path, strategy, fanout, mode):
    from pserver.plan.topology import tree_size

    d = load_dump(sim(tmp_path, *TREES[strategy], f"cluster.tree_fanout={fanout}",
                      f"comm.mode={mode}"))
    assert check_dump(d) == []
    assert d.rows("aggregators") == tree_size(8, fanout)  # each said goodbye and wrote its row
    assert d.group("blocks")["applied"][0] * 16 >= 2 * 1347  # the epochs were trained
    g = d.group("gradients")
    taken = np.bincount(g["learner"], minlength=8)  # through the tree, with their own clocks
    assert np.all(taken >= 1) and taken.sum() <= d.group("learners")["minibatches"].sum()
    counts = d.group("updates")["n_gradients"]
    if strategy == "hardsync":  # a round: every learner, relayed through the tree
        assert np.all(counts == 8) and np.all(d.group("staleness")["staleness"] == 0)
    elif strategy == "async":  # an update: one relayed sum, a top aggregator's subtree
        assert counts.min() >= 2


def test_tree_links_cost_what_sim_tree_latency_says(tmp_path):
    """The same hardsync rounds over slower tree links take longer; 0 takes sim.latency."""
    base = ("protocol.name=hardsync", "cluster.tree_fanout=2", "sim.compute_cv=0")
    runs = {lat: load_dump(sim(tmp_path, *base, f"sim.tree_latency={lat}", name=f"l{lat}"))
            for lat in ("0", "0.00005", "0.001")}  # fmt: skip
    assert runs["0"].attrs["wall_time"] == runs["0.00005"].attrs["wall_time"]  # the default
    assert runs["0.001"].attrs["wall_time"] > runs["0"].attrs["wall_time"] + 0.1
    for d in runs.values():
        assert np.array_equal(d.group("updates")["vector_clock"],
                              runs["0"].group("updates")["vector_clock"])


# -- the broadcast tree (pserver/sim/tree.py, Children) ---------------------------------------

BCAST = {
    "async": ["protocol.name=async"],
    "softsync-tree": ["protocol.name=softsync", "protocol.n=2", "cluster.tree_fanout=2"],
    "hardsync": ["protocol.name=hardsync"],
    "psp": ["protocol.name=psp", "protocol.c=4", "protocol.tau1=0.0005"],
}


@pytest.mark.parametrize("mode", ["nonblocking", "thread"])
@pytest.mark.parametrize("case", sorted(BCAST))
def test_a_broadcast_tree_run_is_consistent_and_relays_from_the_parents(tmp_path, case, mode):
    from pserver.sim.tree import tree_layout

    over = [*BCAST[case], f"comm.mode={mode}", "cluster.bcast_fanout=2"]
    d = load_dump(sim(tmp_path, *over))
    assert check_dump(d) == []
    assert d.group("blocks")["applied"][0] * 16 >= 2 * 1347
    layout = tree_layout(load_config(QUICK, ["cluster.learners=8", *over]))
    index = {r: i for i, r in enumerate(layout.learners)}
    parents = {index[p] for p in layout.bcast_parent.values()}
    lr = d.group("learners")
    relayed = dict(zip(lr["learner"], lr["relayed_bytes"], strict=True))
    assert {k for k, v in relayed.items() if v > 0} == parents  # only the heap's inner nodes
    if case in ("hardsync", "psp"):
        assert np.all(d.group("staleness")["staleness"] == 0)


def test_broadcast_links_cost_what_sim_bcast_latency_says(tmp_path):
    base = ("protocol.name=hardsync", "comm.mode=thread", "cluster.bcast_fanout=2",
            "sim.compute_cv=0")
    fast = load_dump(sim(tmp_path, *base, name="fast"))
    slow = load_dump(sim(tmp_path, *base, "sim.bcast_latency=0.001", name="slow"))
    # three levels below the root: each of the ~21 rounds' models reaches the deepest leaf,
    # whose gradient the next round waits for, 3 hops of 1 ms later
    rounds = fast.rows("updates")
    assert slow.attrs["wall_time"] > fast.attrs["wall_time"] + 0.9 * rounds * 0.003
    assert np.array_equal(fast.group("updates")["vector_clock"],
                          slow.group("updates")["vector_clock"])


def test_both_trees_on_shared_cores(tmp_path):
    """sim.cores: the aggregators' handling of messages runs on the node's cores too."""
    runs = {c: load_dump(sim(tmp_path, "protocol.name=hardsync", "comm.mode=thread",
                             "cluster.tree_fanout=2", "cluster.bcast_fanout=2",
                             "sim.compute=0.002", f"sim.cores={c}", name=f"c{c}"))
            for c in (1, 16)}  # fmt: skip
    for d in runs.values():
        assert check_dump(d) == []
        assert np.all(d.group("aggregators")["cpu_time"] > 0)
    assert runs[1].attrs["wall_time"] > 2 * runs[16].attrs["wall_time"]
    assert np.array_equal(runs[1].group("updates")["vector_clock"],
                          runs[16].group("updates")["vector_clock"])
