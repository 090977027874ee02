"""Stale Synchronous Parallel: one update per gradient, pulls gated by the clock gap."""

from __future__ import annotations

import random

import pytest

from pserver.protocols.base import Arrival
from pserver.protocols.ssp import StaleSynchronous


def push(p: StaleSynchronous, learner: int, ts: int, server_ts: int) -> None:
    assert p.on_gradient(Arrival(learner, ts), server_ts).accept
    assert p.ready()


def test_every_gradient_is_an_update() -> None:
    p = StaleSynchronous(n_learners=3, s=2, lr_policy="none")
    assert not p.ready()
    push(p, 1, 0, server_ts=0)
    d = p.commit(0)
    assert d.new_timestamp == 1 and d.vector_clock == (0,) and d.learners == (1,)
    assert d.divisor == 1.0 and d.lr_scale == 1.0
    assert not p.ready()


@pytest.mark.parametrize(
    ("policy", "weight", "lr_scale"),
    [("none", 1.0, 1.0), ("mean", 1.0, 0.5), ("per-gradient", 0.5, 1.0)],
)
def test_lr_policies(policy: str, weight: float, lr_scale: float) -> None:
    # A gradient from w^3 applied to w^5: σ = 2, ⟨σ⟩ = (6 − 1) − 3 = 2.
    p = StaleSynchronous(n_learners=2, s=1, lr_policy=policy)
    dec = p.on_gradient(Arrival(0, 3), server_ts=5)
    assert dec.accept and dec.staleness == 2 and dec.weight == weight
    d = p.commit(5)
    assert d.mean_staleness == 2.0 and d.lr_scale == lr_scale


def test_pull_gate_with_clocks() -> None:
    # s = 1, three learners. Learner 0 runs ahead; it is held while 2 iterations ahead.
    p = StaleSynchronous(n_learners=3, s=1, lr_policy="none")
    ts = 0
    assert all(p.pull_ready(i) for i in range(3))  # everyone at clock 0
    push(p, 0, ts, ts)
    ts = p.commit(ts).new_timestamp
    assert p.clocks == [1, 0, 0] and p.pull_ready(0)  # gap 1 <= s
    push(p, 0, ts, ts)
    ts = p.commit(ts).new_timestamp
    assert p.clocks == [2, 0, 0] and not p.pull_ready(0)  # gap 2 > s: held
    assert p.pull_ready(1) and p.pull_ready(2)  # the slowest are never held
    push(p, 1, 0, ts)
    ts = p.commit(ts).new_timestamp
    assert not p.pull_ready(0)  # learner 2 still at clock 0
    push(p, 2, 0, ts)
    p.commit(ts)
    assert p.min_clock() == 1 and p.pull_ready(0)


def test_zero_staleness_is_lockstep() -> None:
    p = StaleSynchronous(n_learners=2, s=0, lr_policy="mean")
    push(p, 0, 0, 0)
    p.commit(0)
    assert not p.pull_ready(0) and p.pull_ready(1)
    push(p, 1, 0, 1)
    p.commit(1)
    assert p.pull_ready(0) and p.pull_ready(1)


def test_explicit_learner_clock() -> None:
    p = StaleSynchronous(n_learners=2, s=3, lr_policy="none")
    assert p.pull_ready(0, learner_clock=3)
    assert not p.pull_ready(0, learner_clock=4)
    push(p, 1, 0, 0)
    assert p.min_clock() == 0  # learner 0 has pushed nothing yet
    push(p, 0, 0, 1)
    assert p.min_clock() == 1 and p.pull_ready(0, learner_clock=4)


def test_retired_learner_holds_nobody() -> None:
    p = StaleSynchronous(n_learners=2, s=0, lr_policy="none")
    push(p, 0, 0, 0)
    assert not p.pull_ready(0)
    p.retire(1)
    assert p.pull_ready(0) and p.min_clock() == 1
    p.retire(0)
    assert p.min_clock() is None and p.pull_ready(0, learner_clock=99)


@pytest.mark.parametrize("s", [0, 1, 3])
@pytest.mark.parametrize("seed", range(5))
def test_random_schedule_keeps_the_bound_and_never_deadlocks(s: int, seed: int) -> None:
    # Learners take turns at random; a learner's pull is held while the gate says no and
    # re-tried after every gradient, as the server driver does with its waiting pulls.
    rng = random.Random(seed)
    n = 4
    p = StaleSynchronous(n_learners=n, s=s, lr_policy="none")
    ts, held = 0, set()
    have = [0] * n  # timestamp of the weights each learner computes on
    for _ in range(400):
        runnable = [i for i in range(n) if i not in held]
        assert runnable, "every learner is held: deadlock"
        i = rng.choice(runnable)
        p.on_gradient(Arrival(i, have[i]), ts)
        ts = p.commit(ts).new_timestamp
        held.add(i)  # it pushed; now it pulls
        for j in sorted(held):
            if p.pull_ready(j):
                held.discard(j)
                have[j] = ts  # its pull is answered with the current weights
        assert max(p.clocks) - min(p.clocks) <= s + 1  # started at gap <= s, pushed once more


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="lr_policy"):
        StaleSynchronous(2, 1, "auto")
    with pytest.raises(ValueError, match="s >= 0"):
        StaleSynchronous(2, -1, "none")
    p = StaleSynchronous(2, 1, "none")
    with pytest.raises(ValueError, match="out of range"):
        p.pull_ready(2)
    with pytest.raises(ValueError, match="out of range"):
        p.on_gradient(Arrival(-1, 0), 0)
    assert not p.waits_for_update and p.describe() == "ssp (s=1, lr none)"
