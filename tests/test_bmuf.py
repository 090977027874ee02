"""BMUF and MA in one process: the master's equations (Chen & Huo eqs. 2–6, 10) by hand, the
shard block that runs them, the learner's local rule, and the config's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from pserver import strategies
from pserver.errors import ConfigError
from pserver.optim.block_momentum import BlockMomentum, Filter, default_block_momentum
from pserver.optim.local_rule import LocalRule, block_epoch
from pserver.plan.config import OptimConfig, load_config
from pserver.protocols.block import BlockRound
from pserver.protocols.bmuf_block import BlockMomentumShard, block_filter
from pserver.protocols.epochs import EpochCounter
from pserver.strategies.base import MODEL_AVERAGING

# Dyadic values: every step below is exact in binary floating point, so the hand computation
# is compared for equality.  η = 0.5, ζ = 2, W(0) = 1, G(1..3) = 0.25, -0.5, 0.125:
#   Δ(1) = 0.5·0     + 2·0.25   =  0.5     W(1) = 1.5     NBM W_g(1) = 1.5  + 0.5·0.5    = 1.75
#   Δ(2) = 0.5·0.5   + 2·(-0.5) = -0.75    W(2) = 0.75    NBM W_g(2) = 0.75 - 0.5·0.75   = 0.375
#   Δ(3) = 0.5·-0.75 + 2·0.125  = -0.125   W(3) = 0.625   NBM W_g(3) = 0.625 - 0.5·0.125 = 0.5625
GS = (0.25, -0.5, 0.125)
DELTAS = (0.5, -0.75, -0.125)
WS = (1.5, 0.75, 0.625)
AHEAD = (1.75, 0.375, 0.5625)


@pytest.mark.parametrize("nesterov", [True, False])
def test_eqs_2_to_6_by_hand_over_three_blocks(nesterov):
    """The learners' mean model W̄(t) = W_g(t−1) + G(t): the start the served model gave."""
    rule = BlockMomentum(Filter(4, 0.5, 2.0, nesterov), 1, np, np.float64)
    w = np.ones(1)
    start = 1.0
    assert rule.served(w)[0] == start  # Δ(0) = 0: W_g(0) = W(0)
    for g, delta, w_t, ahead in zip(GS, DELTAS, WS, AHEAD, strict=True):
        norms = rule.step(w, np.array([start + g]))  # eq. (2): G = W̄ − W_g(t−1)
        assert rule.delta[0] == delta and w[0] == w_t  # eqs. (3), (4)
        assert norms.g == abs(g) and norms.delta == abs(delta)
        served = rule.served(w, np.empty(1))
        assert served[0] == (ahead if nesterov else w_t)  # eq. (6) or eq. (5)
        assert w[0] == w_t  # serving never moves W(t)
        start = float(served[0])


@pytest.mark.parametrize("nesterov", [True, False])
def test_ma_is_the_mean_of_the_local_models(nesterov):
    """η = 0, ζ = 1: W(t) = W̄(t) exactly, Δ(t) = G(t), and W(t) is what learners pull."""
    rule = BlockMomentum(Filter(1, 0.0, 1.0, nesterov), 3, np, np.float32)
    w = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    mean = np.mean([w + np.float32(0.1), w - np.float32(0.3)], axis=0).astype(np.float32)
    g = mean - w
    norms = rule.step(w, mean.copy())
    np.testing.assert_array_equal(w, mean)
    np.testing.assert_array_equal(rule.delta, g)
    assert norms.g == norms.delta == pytest.approx(float(np.linalg.norm(g)))
    assert rule.served(w) is w


def test_ma_takes_the_mean_where_w_plus_g_would_miss_it():
    """A fused multiply-add left x − W inexact: W + (x − W) is not x, the MA model is."""
    w = np.array([-0.012853466], dtype=np.float32)
    x = np.float32(-0.004389644)  # RN(W + b) for a b no float32 holds (an FMA's product)
    assert w[0] + (x - w[0]) != x
    rule = BlockMomentum(Filter(1, 0.0, 1.0, False), 1, np, np.float32)
    rule.step(w, np.array([x], dtype=np.float32))
    assert w[0] == x


def test_nesterov_gain_is_the_papers_not_the_look_ahead_variant():
    """A constant G = 1 per block: the paper's filter moves W(t), and W_g(t) with it, by
    ζ/(1 − η) = 8 per block at η = 0.875. The variant that updates the look-ahead model and
    never subtracts η·Δ(t−1) (fairseq, CNTK) moves it by 1 + 2η/(1 − η) = 15."""
    eta = 0.875
    rule = BlockMomentum(Filter(1, eta, 1.0, True), 1, np, np.float64)
    w, prev = np.zeros(1), 0.0
    for _ in range(400):
        rule.step(w, rule.served(w) + 1.0)  # every block moves the local models by G = 1
        served = float(rule.served(w)[0])
        step, prev = served - prev, served
    assert step == pytest.approx(8.0, abs=1e-9)
    # the variant, for contrast: W_g(t) = W_g(t−1) + Δ(t) + η·Δ(t), the paper's eq. (6)
    # without "− η·Δ(t−1)" (W(t) = W_g(t−1) − η·Δ(t−1) + Δ(t))
    wg, d = 0.0, 0.0
    for _ in range(400):
        d = eta * d + 1.0
        wg_next = wg + d + eta * d
        wg, vstep = wg_next, wg_next - wg
    assert vstep == pytest.approx(15.0, abs=1e-9)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_eq_10_default_block_momentum(n):
    eta = default_block_momentum(n)
    assert eta == 1.0 - 1.0 / n
    assert 1.0 / (n * (1.0 - eta)) == pytest.approx(1.0)  # ζ / (λ(1 − η)) = C = 1
    assert default_block_momentum(4, block_lr=2.0, gain=2.0) == 0.75


def test_filter_from_the_config():
    bm = load_config(None, ["protocol.name=bmuf", "protocol.tau=3"])
    assert block_filter(bm, 4) == Filter(3, 0.75, 1.0, True)
    assert block_filter(bm, 8).eta == 0.875
    cbm = load_config(None, ["protocol.name=bmuf", "protocol.nesterov=false",
                             "protocol.block_momentum=0.5", "protocol.block_lr=2.0"])
    assert block_filter(cbm, 4) == Filter(8, 0.5, 2.0, False)
    ma = load_config(None, ["protocol.name=ma", "protocol.tau=2"])
    assert block_filter(ma, 4) == Filter(2, 0.0, 1.0, False)


def shard(n_learners: int, flt: Filter, w0) -> BlockMomentumShard:  # noqa: ANN001
    counter = EpochCounter(train_size=100, batch_size=10 * flt.tau, epochs=10)
    rule = BlockMomentum(flt, w0.size, np, w0.dtype)
    return BlockMomentumShard(w0, BlockRound(n_learners, flt.tau), rule, OptimConfig(), counter, np)


def push(b: BlockMomentumShard, learner: int, model) -> None:  # noqa: ANN001
    buf = b.inbox()
    buf[...] = model
    assert b.accept([(learner, b.ts, None)], buf, 0.0).accepted
    b.keep()


def test_shard_block_averages_models_and_serves_the_look_ahead_apart_from_w():
    """Two learners' models per round: G is their mean less W_g(t−1) (eq. 2), W(t) follows
    eqs. (3)–(4), the buffer pulls read gets W_g(t) (eq. 6), and the first served buffer is
    never W(t)."""
    served = np.ones(1)
    b = shard(2, Filter(2, 0.5, 2.0, True), served)
    assert b.w is not served and b.serve() is not served
    start = 1.0
    for t, (g, w_t, ahead) in enumerate(zip(GS, WS, AHEAD, strict=True), start=1):
        push(b, 0, start + g - 0.125)
        assert not b.ready(0.0)
        push(b, 1, start + g + 0.125)
        assert b.ready(0.0)
        into = np.full(1, np.nan)
        applied = b.apply(b.commit(), into)
        assert b.ts == t and b.w[0] == w_t and into[0] == ahead and b.serve()[0] == ahead
        (group, row), = applied.rows
        assert group == "rounds" and row["round"] == t and row["learners"] == 2
        assert row["g_norm"] == abs(g) and row["local_steps"] == 4 and row["eta"] == 0.5
        start = ahead
    assert served[0] == 1.0  # the first version was never written by an update


def test_a_delta_from_an_older_global_model_is_refused():
    b = shard(2, Filter(1, 0.0, 1.0, False), np.zeros(2))
    push(b, 0, np.ones(2))
    push(b, 1, np.ones(2))
    b.apply(b.commit())
    buf = b.inbox()
    buf[...] = 1.0
    taken = b.accept([(0, 0, None)], buf, 0.0)  # computed on W_g(0), the block is at 1
    assert not taken.accepted and taken.decisions[0].staleness == 1


def test_epochs_count_tau_minibatches_per_delta():
    """λ = 2, τ = 3, 10 samples a minibatch, 100 an epoch: a round is 60 samples."""
    b = shard(2, Filter(3, 0.0, 1.0, False), np.zeros(1))
    ends = []
    for _ in range(4):
        push(b, 0, np.zeros(1))
        push(b, 1, np.zeros(1))
        b.apply(b.commit())
        ends.append(b.epoch_ends().ended)
    assert ends == [(), (1,), (), (2,)]  # 60, 120, 180, 240 samples


def test_local_rule_resets_momentum_at_each_block_and_follows_the_schedule():
    cfg = OptimConfig(rule="momentum", lr=0.5, momentum=0.5, lr_milestones=[1], lr_gamma=0.1)
    # λ = 2, τ = 2, batch 5, 20 samples an epoch: a block is 20 samples, one epoch
    rule = LocalRule(cfg, 1, np, np.float64, (2, 2, 5, 20))
    w = np.zeros(1)
    rule.start(0)
    rule.step(w, np.ones(1))  # v = 1, w = -0.5
    rule.step(w, np.ones(1))  # v = 1.5, w = -1.25
    assert w[0] == -1.25
    rule.start(1)  # epoch 1: lr 0.05, velocity zero again
    rule.step(w, np.ones(1))
    assert w[0] == pytest.approx(-1.25 - 0.05)
    assert [block_epoch(t, 4, 8, 16, 1347) for t in (0, 2, 3, 10)] == [0, 0, 1, 3]


def test_registry_entries():
    for name in ("bmuf", "ma"):
        s = strategies.lookup(name)
        assert s.family == MODEL_AVERAGING and s.waits_for_update and not s.tree
        assert s.exchange("blocking") == strategies.LOCAL_STEPS
    assert {p.key for p in strategies.lookup("bmuf").params} == {
        "block_momentum", "block_lr", "nesterov"}
    assert not strategies.lookup("ma").params


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["protocol.tau=0"], "protocol.tau = 0: expected a value > 0"),
        (["protocol.block_momentum=1.0"], r"protocol.block_momentum = 1.0: expected η in \[0, 1\)"),
        (["protocol.block_momentum=-0.5"], "protocol.block_momentum = -0.5"),
        (["protocol.block_lr=0"], "protocol.block_lr = 0.0: expected a value > 0"),
        (["comm.mode=thread"], 'comm.mode = .thread.: protocol.name = .bmuf. pulls'),
        (["comm.mode=nonblocking"], "use comm.mode = \"blocking\""),
        (["cluster.tree_fanout=2"], "without aggregator or broadcast trees"),
        (["protocol.pull_fraction=0.5"], "protocol.pull_fraction = 0.5 belongs to hardsync"),
        (["protocol.pull_timestamp='iteration'"], "protocol.pull_timestamp"),
        (["comm.max_inflight=2"], "comm.max_inflight = 2"),
    ],
)
def test_bad_input_is_refused_before_training(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["protocol.name=bmuf", *overrides])


@pytest.mark.parametrize("key", ["block_momentum=0.5", "block_lr=2.0", "nesterov=false"])
def test_ma_refuses_the_bmuf_keys(key):
    with pytest.raises(ConfigError, match="belongs to bmuf"):
        load_config(None, ["protocol.name=ma", f"protocol.{key}"])


def test_defaults_accepted():
    cfg = load_config(None, ["protocol.name=bmuf", "protocol.block_momentum=0.0"])
    assert cfg.protocol.block_momentum == 0.0 and cfg.protocol.nesterov
    load_config(None, ["protocol.name=ma", "protocol.tau=1"])


def test_teacher_task_is_seeded_balanced_and_noisy():
    from learners.teacher import teacher_task

    X, y = teacher_task(2000, seed=3)
    X2, y2 = teacher_task(2000, seed=3)
    assert X.dtype == np.float32 and X.shape == (2000, 32) and y.dtype == np.int64
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    assert np.bincount(y, minlength=10).min() > 50  # every class present
    _, clean = teacher_task(2000, seed=3, noise=0.0)
    assert 0.02 < np.mean(clean != y) < 0.5  # the noise flips some labels, not most
