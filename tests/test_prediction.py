"""PP-ASGD's arithmetic (pserver/optim/prediction.py) and its place in the shard block, one process:
f_S by hand for S = 0, 1, 3, the S estimate from scripted arrivals, the error probe, and the
refusals of the config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pserver.errors import ConfigError
from pserver.optim.prediction import (
    ErrorProbe,
    Predictor,
    StalenessMean,
    horizon_sum,
    paper_staleness,
    predict,
    prediction_error,
    velocity_coefficient,
)
from pserver.optim.rules import Updater
from pserver.plan.config import OptimConfig, load_config
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.rudra import Softsync
from pserver.protocols.shard_block import ShardBlock

W = np.array([1.0, 2.0])
V = np.array([4.0, -2.0])  # a velocity; lr 0.25 makes M = -lr·v = [-1, 0.5] (momentum)


def test_horizon_sum_by_hand():
    assert horizon_sum(0.5, 0) == 0.5
    assert horizon_sum(0.5, 1) == 0.75
    assert horizon_sum(0.5, 3) == 0.5 + 0.25 + 0.125 + 0.0625
    with pytest.raises(ValueError):
        horizon_sum(0.5, -1)


@pytest.mark.parametrize(
    "steps, expected",
    [(0, [0.5, 2.25]), (1, [0.25, 2.375]), (3, [0.0625, 2.46875])],
)
def test_f_S_by_hand_momentum(steps, expected):
    # f_S(w, M) = w + M·Σ_{s=1}^{S+1} μ^s with μ = 0.5, M = [-1, 0.5]: every value exact
    k = velocity_coefficient("momentum", 0.5, 0.25, steps)
    out = np.empty_like(W)
    assert predict(W, V, k, out) is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(W, [1.0, 2.0])  # w untouched


def test_f_S_by_hand_nesterov():
    # nesterov's momentum term is -lr·μ·v = [-0.5, 0.25]; S = 1: w + 0.75·M
    out = predict(W, V, velocity_coefficient("nesterov", 0.5, 0.25, 1), np.empty_like(W))
    np.testing.assert_array_equal(out, [0.625, 2.1875])


@pytest.mark.parametrize("rule", ["momentum", "nesterov"])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_f_S_is_where_the_momentum_alone_carries_w_in_S_plus_1_steps(rule, steps):
    """The paper's model: no new gradient for S + 1 updates. The updater itself, stepped with
    zero gradients, must land on f_S (this pins M against optim.py's velocity form)."""
    rng = np.random.default_rng(1)
    u = Updater(rule, 8, np, np.float64, momentum=0.9)
    w = rng.standard_normal(8)
    for _ in range(3):  # some history in the velocity
        u.step(w, rng.standard_normal(8), 0.1)
    v = u.state_arrays()["velocity"]
    served = predict(w, v, velocity_coefficient(rule, 0.9, 0.1, steps), np.empty(8))
    for _ in range(steps + 1):
        u.step(w, np.zeros(8), 0.1)
    np.testing.assert_allclose(served, w, rtol=1e-12, atol=1e-12)


def test_prediction_needs_a_momentum_rule():
    with pytest.raises(ValueError, match="momentum rule"):
        velocity_coefficient("sgd", 0.9, 0.1, 0)
    with pytest.raises(ValueError, match="momentum rule"):
        Predictor("adagrad", 0.9, -1, 0, 4)


def test_running_mean_and_S_by_hand():
    m = StalenessMean(window=3)
    assert m.value == 0.0
    for x in (0.0, 1.0, 2.0, 6.0):  # the 0 leaves the window
        m.add(x)
    assert m.value == 3.0
    m.add(0.5)
    assert m.value == pytest.approx(8.5 / 3)


def block(learners: int, fixed_steps: int = -1, probe: int = 0, rule="momentum") -> ShardBlock:
    cfg = OptimConfig(rule=rule, lr=0.1, momentum=0.9)
    counter = EpochCounter(train_size=10, batch_size=10, epochs=1000, basis="applied")
    updater = Updater(rule, 4, np, np.float64, cfg.momentum, cfg.weight_decay)
    b = ShardBlock(np.zeros(4), Softsync(learners, learners, "none"), updater, cfg, counter, np)
    b.predicting(fixed_steps, probe)
    return b


def arrive(b: ShardBlock, learner: int, ts: int, g: np.ndarray):
    buf = b.inbox()
    buf[...] = g
    b.accept([(learner, ts, None)], buf, 0.0)
    assert b.ready(0.0)
    return b.apply(b.commit())


def round_robin(b: ShardBlock, learners: int, updates: int) -> list[int]:
    """Async, λ learners in turn, each pulling right after its push: learner i's gradient was
    computed on the weights of λ − 1 updates ago (σ = λ − 1 once all are going)."""
    pulled = [0] * learners
    served = []
    for u in range(updates):
        i = u % learners
        applied = arrive(b, i, pulled[i], np.full(4, 1.0))
        pulled[i] = b.ts
        served.append(applied.steps)
    return served


def test_S_from_scripted_arrivals_is_the_floor_of_the_measured_mean():
    b = block(4)
    served = round_robin(b, 4, 200)
    # σ of the first four: 0, 1, 2, 3; then always 3
    assert served[:4] == [0, 0, 1, 1]  # ⌊0⌋, ⌊0.5⌋, ⌊1⌋, ⌊1.5⌋
    assert served[-1] == 3 and b.predictor.mean.value == 3.0
    assert b.predictor.steps == 3


def test_fixed_steps_override_the_measurement():
    b = block(4, fixed_steps=1)
    assert set(round_robin(b, 4, 20)) == {1}


def test_serve_writes_the_prediction_and_never_w():
    b = block(2, fixed_steps=3)
    round_robin(b, 2, 5)
    w_before = b.w.copy()
    out = np.empty(4)
    assert b.serve(out) is out
    v = b.updater.state_arrays()["velocity"]
    np.testing.assert_array_equal(out, b.w + (-b.predictor.lr * horizon_sum(0.9, 3)) * v)
    np.testing.assert_array_equal(b.w, w_before)
    assert b.serve() is not b.w  # without out: a buffer of its own, still not w
    np.testing.assert_array_equal(b.serve(), out)


def test_error_probe_by_hand():
    p = ErrorProbe(every=2, size=2)
    p.start(1, np.array([1.0, 1.0]), np.array([1.0, 0.0]), -0.5, steps=1)  # 1 % 2: not due
    assert p.origin == -1
    p.start(2, np.array([1.0, 1.0]), np.array([2.0, 0.0]), -0.5, steps=1)  # M = [-1, 0]
    assert p.finish(3, np.zeros(2), 0.5) is None  # due at 2 + S + 1 = 4
    r = p.finish(4, np.array([0.0, 1.0]), 0.5)  # d = [-1, 0]
    assert (r.origin, r.steps, r.horizon, r.dd, r.dm, r.mm) == (2, 1, 2, 1.0, 1.0, 1.0)
    # f_1 = w + 0.75·M = [0.25, 1]; w_4 = [0, 1]: error 0.25
    assert r.error == pytest.approx(0.25)
    assert prediction_error(r.dd, r.dm, r.mm, 0.5, 0) == pytest.approx(0.5)
    assert p.origin == -1  # ready for the next


def test_probe_in_the_block_measures_against_the_weights_S_plus_1_updates_later():
    b = block(1, fixed_steps=2, probe=4)
    history, probes = [b.w.copy()], []
    m_at = {}
    for u in range(12):
        applied = arrive(b, 0, b.ts, np.arange(4.0) + u)
        history.append(b.w.copy())
        m_at[b.ts] = -b.predictor.lr * b.updater.state_arrays()["velocity"].copy()
        if applied.probe is not None:
            probes.append(applied.probe)
    assert [(p.origin, p.horizon) for p in probes] == [(4, 3), (8, 3)]
    for p in probes:
        f = history[p.origin] + m_at[p.origin] * horizon_sum(0.9, 2)
        assert p.error == pytest.approx(np.linalg.norm(history[p.origin + 3] - f))


def test_paper_staleness_eq_1():
    # async, λ = 4: one gradient per update, F_U = 4·F_G, S̄ = 5
    assert paper_staleness(updates=100, gradients=100, learners=4) == 5.0
    # 2-softsync with λ = 4: two gradients per update, S̄ = 3
    assert paper_staleness(updates=50, gradients=100, learners=4) == 3.0
    assert math.isclose(paper_staleness(0, 0, 4), 1.0)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["protocol.name=hardsync"], "under hardsync every gradient is computed on the current"),
        (["protocol.name=async", "optim.rule=sgd"], "optim.rule = 'sgd' has none"),
        (["protocol.name=ssp", "optim.rule=adagrad"], "optim.rule = 'adagrad' has none"),
        (["protocol.name=async", "optim.rule=momentum", "optim.momentum=0"], "momentum = 0"),
        (["protocol.name=async", "optim.rule=momentum", "protocol.predict_steps=-2"],
         "protocol.predict_steps = -2"),
    ],
)
def test_refused_before_training(overrides, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, ["protocol.predict=true", *overrides])
    assert fragment in str(info.value)


@pytest.mark.parametrize("key", ["protocol.predict_steps=2", "protocol.predict_probe=10"])
def test_prediction_keys_without_predict_are_refused(key):
    with pytest.raises(ConfigError, match="belongs to protocol.predict = true"):
        load_config(None, ["protocol.name=async", key])


@pytest.mark.parametrize(
    "name, extra",
    [("async", []), ("softsync", ["protocol.n=2"]), ("ssp", []), ("psp", []),
     ("psp", ["protocol.pull_fraction=0.5", "blocks.count=2"]), ("async", ["comm.mode=thread"]),
     ("async", ["comm.transport=shm"]), ("softsync", ["cluster.tree_fanout=2"])],
)
def test_accepted_with_every_stale_strategy_mode_and_transport(name, extra):
    cfg = load_config(
        None, [f"protocol.name={name}", "protocol.predict=true", "optim.rule=nesterov", *extra]
    )
    assert cfg.protocol.predict
