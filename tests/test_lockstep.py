"""Learners-only runs (issue 12 item 5): when they end, which step ends which epoch, what the
data server serves, and a learner's local update (pure, no MPI)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from learners.serial import serial_steps
from pserver.optim.local_update import LocalUpdate
from pserver.optim.rules import make_updater, scheduled_lr
from pserver.plan.config import load_config
from pserver.plan.topology import NO_SHARD, make_layout, split_blocks
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.lockstep import (
    FREE,
    LOCKSTEP,
    DataQuota,
    LockstepDraws,
    RunPlan,
    lockstep_steps,
    total_minibatches,
)


def plan(n_learners: int, epochs: int = 3, train: int = 1347, batch: int = 16) -> RunPlan:
    counter = EpochCounter(train, batch, epochs)
    return RunPlan(counter, n_learners)


@pytest.mark.parametrize("lam", [1, 2, 3, 4, 5, 8])
def test_every_learner_stops_at_the_same_step_and_covers_the_run(lam):
    """The stop is a function of (config, λ): S · λ >= M > (S - 1) · λ, the last step ends the
    run on every learner, and the epoch ends are the same sequence for each of them."""
    cfg = load_config(None, ["run.epochs=3", "data.batch_size=16"])
    M = total_minibatches(cfg, 1347)
    assert M == serial_steps(cfg, 1347)
    plans = [plan(lam) for _ in range(lam)]
    S = plans[0].steps
    assert S == lockstep_steps(M, lam) and S * lam >= M > (S - 1) * lam
    seqs = []
    for p in plans:
        ends = [p.ends(k) for k in range(S)]
        assert [p.last(k) for k in range(S)] == [False] * (S - 1) + [True]
        assert ends[-1].done and not any(e.done for e in ends[:-1])
        assert [e for x in ends for e in x.ended] == [1, 2, 3]
        seqs.append(ends)
    assert all(s == seqs[0] for s in seqs)


def test_one_learner_plan_is_the_serial_run():
    """λ = 1: as many steps as the serial reference, each in the serial reference's epoch."""
    cfg = load_config(None, ["run.epochs=4", "data.batch_size=10"])
    p = RunPlan.from_config(cfg, 105, 1)
    assert p.steps == serial_steps(cfg, 105)
    # the serial reference's fractional epoch (the schedule's warm-up moves within an epoch)
    assert [p.epoch(k) for k in range(p.steps)] == [k * 10 / 105 for k in range(p.steps)]


def test_epoch_of_a_step_counts_every_learners_minibatches():
    p = plan(4, epochs=2, train=64, batch=8)  # 8 minibatches an epoch: 2 lockstep steps
    assert [p.epoch(k) for k in range(p.steps)] == [0, 0.5, 1, 1.5]  # fractional since issue 25


@pytest.mark.parametrize("lam", [1, 2, 3, 5])
def test_lockstep_quota_serves_each_learner_its_steps_whatever_the_order(lam):
    """A learner that asks ahead (prefetching) cannot take a slower learner's minibatch."""
    M = 23
    S = lockstep_steps(M, lam)
    rng = random.Random(lam)
    q = DataQuota(LOCKSTEP, M, lam)
    requests = [i for i in range(lam) for _ in range(S + 3)]
    rng.shuffle(requests)
    got = {i: 0 for i in range(lam)}
    for i in requests:
        got[i] += q.allows(i)
    assert got == {i: S for i in range(lam)}


def test_free_quota_stops_the_global_count_at_M():
    q = DataQuota(FREE, 10, 3)
    answers = [q.allows(i % 3) for i in itertools.islice(itertools.count(), 20)]
    assert sum(answers) == 10 and answers[:10] == [True] * 10 and not any(answers[10:])
    with pytest.raises(ValueError, match="quota kind"):
        DataQuota("sometimes", 10, 3)


def test_no_servers_layout_and_blocks():
    cfg = load_config(None)
    cfg.cluster.servers = 0  # a learners-only strategy's (tests/test_collective_config.py)
    lay = make_layout(6, cfg)
    assert lay.servers == () and lay.stats == 0 and lay.data == 1 and lay.learners == (2, 3, 4, 5)
    blocks = split_blocks(100, [100], "size", 1, 0)
    assert [(b.start, b.stop, b.shard) for b in blocks] == [(0, 100, NO_SHARD)]


@pytest.mark.parametrize("rule", ["sgd", "momentum", "nesterov", "adagrad"])
def test_local_update_is_the_servers_update(rule):
    """Same rule, weight decay and schedule as a shard's updater: bit for bit."""
    cfg = load_config(None, [f'optim.rule="{rule}"', "optim.weight_decay=1e-3",
                             "optim.lr_milestones=[1]", "optim.lr_gamma=0.5"])
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(50).astype(np.float32)
    w_local, w_ref = w0.copy(), w0.copy()
    local = LocalUpdate(cfg.optim, 50, np, np.float32)
    ref = make_updater(cfg.optim, 50, np, np.float32)
    for step in range(6):
        g = rng.standard_normal(50).astype(np.float32)
        local.step(w_local, g.copy(), epoch=step // 3)
        ref.step(w_ref, g.copy(), scheduled_lr(cfg.optim, step // 3))
    assert np.array_equal(w_local, w_ref)


def test_local_update_divides_a_sum_and_scales():
    cfg = load_config(None, ['optim.rule="sgd"', "optim.weight_decay=0", "optim.lr=0.5",
                             "data.batch_size=4"])
    u = LocalUpdate(cfg.optim, 3, np, np.float64, scale=2.0)
    w = np.zeros(3)
    u.step(w, np.array([4.0, 8.0, 0.0]), epoch=0, divisor=4.0)
    assert np.array_equal(w, [-1.0, -2.0, 0.0]) and u.lr == 1.0


def test_lockstep_draws_follow_the_stream_whatever_the_request_order():
    counter = itertools.count()
    draws = LockstepDraws(3, lambda: next(counter))
    order = [(2, 0), (2, 1), (0, 0), (1, 0), (0, 1), (1, 1), (2, 2), (0, 2), (1, 2)]
    got = {(i, k): draws.take(i, k) for i, k in order}
    assert got == {(i, k): 3 * k + i for i, k in order}
    assert draws.pending == {}
