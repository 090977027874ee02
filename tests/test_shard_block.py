"""The shard block's arithmetic (pserver/protocols/shard_block.py) in one process: every update
rule, the
per-gradient rates, drops and rounds of every protocol, the zero-copy hold, versions, serve."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from pserver.optim.rules import RULES, Updater
from pserver.plan.config import OptimConfig
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.psp import PartialPush
from pserver.protocols.rudra import Hardsync, Softsync
from pserver.protocols.shard_block import ShardBlock
from pserver.protocols.ssp import StaleSynchronous

N = 16
RNG = np.random.default_rng(7)
W0 = RNG.standard_normal(N).astype(np.float32)
G = [RNG.standard_normal(N).astype(np.float32) for _ in range(4)]


def make(protocol, rule="sgd", epochs=100, basis="applied", **optim) -> ShardBlock:
    cfg = OptimConfig(rule=rule, lr=0.1, **optim)
    counter = EpochCounter(train_size=10, batch_size=10, epochs=epochs, basis=basis)
    updater = Updater(rule, N, np, np.float32, cfg.momentum, cfg.weight_decay)
    return ShardBlock(W0.copy(), protocol, updater, cfg, counter, np)


def push(b: ShardBlock, g, learner=0, ts=None, it=None, now=0.0):
    buf = b.inbox()
    buf[...] = g
    return b.accept([(learner, b.ts if ts is None else ts, it)], buf, now)


def step(b: ShardBlock, into=None):
    assert b.ready(0.0)
    return b.apply(b.commit(), into)


def reference(rule, steps, **optim):
    """w after ``steps`` = [(g, lr), ...] of the plain updater."""
    cfg = OptimConfig(rule=rule, lr=0.1, **optim)
    u, w = Updater(rule, N, np, np.float32, cfg.momentum, cfg.weight_decay), W0.copy()
    for g, lr in steps:
        u.step(w, g.copy(), lr)
    return w


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_through_a_hardsync_round(rule):
    b = make(Hardsync(2, 10, 10), rule, weight_decay=0.01)
    push(b, G[0], learner=0)
    assert not b.ready(0.0)
    push(b, G[1], learner=1)
    applied = step(b)
    mean = G[0] + G[1]
    np.multiply(mean, 0.5, out=mean)
    assert applied.lr == 0.1 * math.sqrt(2)  # √(λμ/B)
    assert np.array_equal(b.w, reference(rule, [(mean, applied.lr)], weight_decay=0.01))
    assert (b.ts, b.applied, b.dropped) == (1, 2, 0)


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_through_async_rounds(rule):
    b = make(Softsync(2, 2, "none"), rule)
    for g in G[:3]:
        push(b, g)
        step(b)
    assert np.array_equal(b.w, reference(rule, [(g, 0.1) for g in G[:3]]))
    assert b.ts == 3


def test_async_updates_from_the_receive_buffer_without_a_copy():
    b = make(Softsync(1, 1, "none"))
    push(b, G[0])
    assert b.held is b.recv  # left where it arrived
    step(b)
    assert b.held is None and np.array_equal(b.w, reference("sgd", [(G[0], 0.1)]))


def test_a_second_gradient_moves_the_held_one_out_of_the_receive_buffer():
    b = make(Softsync(2, 1, "none"))  # 1-softsync of 2: rounds of two
    push(b, G[0], learner=0)
    held = b.held
    buf = b.inbox()
    assert buf is not held and b.accum is held and b.held is None


def test_a_gradient_in_a_shared_slot_is_copied_out():
    b = make(Softsync(2, 1, "none"))
    slot = G[0].copy()
    b.accept([(0, 0, None)], slot, 0.0)
    assert b.held is slot
    b.keep()  # the learner may reuse its slot now
    slot[...] = 0.0
    assert b.held is None and np.array_equal(b.accum, G[0])
    push(b, G[1], learner=1)
    step(b)
    expected = reference("sgd", [((G[0] + G[1]) * np.float32(0.5), 0.1)])
    assert np.array_equal(b.w, expected)


def test_per_gradient_rates_weigh_each_gradient_by_its_staleness():
    b = make(Softsync(2, 2, "per-gradient"))  # async, gradient weight 1/max(σ, 1)
    for g in G[:2]:
        push(b, g)
        step(b)
    w = b.w.copy()
    taken = push(b, G[2], ts=0)  # σ = 2
    assert taken.decisions[0].weight == 0.5 and b.held is None  # scaled into the accumulator
    applied = step(b)
    assert applied.lr == 0.1 and applied.decision.divisor == 1.0
    Updater("sgd", N, np, np.float32).step(w, G[2] * np.float32(0.5), 0.1)
    assert np.array_equal(b.w, w)


def test_mean_staleness_scales_the_rate():
    b = make(Softsync(2, 1, "mean"))  # rounds of two, α0 / ⟨σ⟩
    for _ in range(2):
        for learner in (0, 1):
            push(b, G[learner], learner=learner)
        step(b)
    push(b, G[2], learner=0, ts=0)  # σ = 2
    push(b, G[3], learner=1, ts=0)
    applied = step(b)
    assert applied.decision.mean_staleness == 2.0 and applied.lr == 0.1 / 2.0


def test_hardsync_drops_a_gradient_of_superseded_weights():
    b = make(Hardsync(1, 10, 10))
    push(b, G[0])
    step(b)
    w = b.w.copy()
    taken = push(b, G[1], ts=0)
    assert not taken.accepted and not taken.after_stop
    assert (b.dropped, b.in_round) == (1, 0) and not b.ready(0.0)
    assert np.array_equal(b.w, w)


def test_psp_closes_at_c_and_scales_by_d():
    b = make(PartialPush(3, 2, 0.0))  # c = 2 of 3, no timeout
    push(b, G[0], learner=0, it=0)
    assert not b.ready(0.0)
    push(b, G[1], learner=1, it=0)
    applied = step(b)
    assert applied.decision.divisor == 2.0 and applied.lr == 0.2  # w − d·η·(Σg/d)
    taken = push(b, G[2], learner=2, ts=0, it=0)  # the round it answers is closed: dropped
    assert not taken.accepted and b.dropped == 1


def test_psp_timeout_after_the_c_th_gradient():
    b = make(PartialPush(3, 1, 5.0))  # c = 1, τ1 = 5 s
    push(b, G[0], learner=0, it=0, now=10.0)
    assert b.protocol.deadline() == 15.0
    assert not b.ready(14.0) and b.ready(15.0)
    push(b, G[1], learner=1, it=0, now=11.0)
    push(b, G[2], learner=2, it=0, now=12.0)
    assert b.ready(12.0)  # every learner responded: no need to wait for τ1
    assert b.apply(b.commit()).decision.divisor == 3.0


def test_ssp_holds_a_learner_too_far_ahead():
    b = make(StaleSynchronous(2, 1, "none"))  # s = 1
    for _ in range(2):
        push(b, G[0], learner=0)
        step(b)
    assert not b.protocol.pull_ready(0) and b.protocol.pull_ready(1)
    push(b, G[1], learner=1, ts=0)
    step(b)
    assert b.protocol.pull_ready(0)


def test_scheduled_rate_follows_the_epoch_of_the_gradients():
    b = make(Softsync(1, 1, "none"), lr_milestones=[1], lr_gamma=0.5)  # one gradient an epoch
    push(b, G[0])
    assert step(b).lr == 0.1  # epoch 0
    push(b, G[1])
    assert step(b).lr == 0.05  # epoch 1


def test_epoch_ends_and_stop():
    b = make(Softsync(1, 1, "none"), epochs=2)
    push(b, G[0])
    step(b)
    assert b.epoch_ends().tested == (1,) and not b.done
    push(b, G[1])
    step(b)
    assert b.epoch_ends().done and b.done
    w = b.w.copy()
    taken = push(b, G[2])
    assert taken.after_stop and not taken.accepted and b.dropped == 0
    assert np.array_equal(b.w, w)


def test_computed_basis_counts_a_drop_towards_the_epoch():
    b = make(Hardsync(1, 10, 10), epochs=3, basis="computed")
    push(b, G[0])
    step(b)
    b.epoch_ends()
    push(b, G[1], ts=0)  # dropped: still a minibatch of the epoch
    assert b.epoch_ends().ended == (2,)


def test_update_into_a_new_version_leaves_the_read_one_alone():
    b = make(Softsync(1, 1, "none"))
    read = b.w
    into = read.copy()  # the driver's copy-on-write
    push(b, G[0])
    step(b, into)
    assert b.w is into and np.array_equal(read, W0)
    assert np.array_equal(into, reference("sgd", [(G[0], 0.1)]))


def test_update_from_a_source_copies_while_it_steps():
    """A new version written by the fused step (``source``: the read version, ``into``: an
    uninitialised buffer) holds what the copy then the step would, and the read one is kept."""
    b = make(Softsync(1, 1, "none"))
    read = b.w
    into = np.full_like(read, np.nan)
    push(b, G[0])
    assert b.ready(0.0)
    b.apply(b.commit(), into, source=read)
    assert b.w is into and np.array_equal(read, W0)
    assert np.array_equal(into, reference("sgd", [(G[0], 0.1)]))
    assert b.fuses_copy


def test_serve_gives_w_or_a_copy():
    b = make(Softsync(1, 1, "none"))
    assert b.serve() is b.w
    out = np.empty_like(b.w)
    assert b.serve(out) is out and np.array_equal(out, b.w)


def test_the_shard_arithmetic_is_pure():
    """The block, the epoch counter and the pull rule load neither MPI nor a role or comm module."""
    code = (
        "import sys, pserver.protocols.shard_block, pserver.protocols.epochs, "
        "pserver.protocols.pull\n"
        "bad = [m for m in sys.modules if m == 'mpi4py' or m.startswith(('pserver.roles', "
        "'pserver.comm'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
