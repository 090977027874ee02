"""Pure parts of the checkpoints of the collective (SYNC, HYBRID) and model-averaging (BMUF,
MA) families, in one process: the learners' stop vote, the lockstep draws a data server keeps,
a BMUF master block restored, what is supported (the MPI jobs: tests/test_mpi_ckfam.py)."""

from __future__ import annotations

import logging
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from learners.data import BatchSampler
from pserver.ckpt.drivers.draws import draws_state, restore_draws
from pserver.ckpt.records.shard import block_state, restore_block
from pserver.ckpt.resume import unsupported
from pserver.comm.waiting import PeerLog, Waiter
from pserver.plan.config import Config
from pserver.protocols.bmuf_block import BlockMomentumShard
from pserver.protocols.lockstep import LOCKSTEP, DataQuota, LockstepDraws
from pserver.roles.stop_vote import StopVote
from pserver.runtime.signals import STOP


def waiter() -> Waiter:
    return Waiter(logging.getLogger("test"), PeerLog(), stall_timeout=30.0)


def test_the_stop_vote_stops_one_boundary_after_the_signal_and_posts_none_at_the_last():
    vote = StopVote(MPI.COMM_SELF, waiter())
    try:
        assert vote.boundary(True) is False  # boundary 0: votes "go on"
        STOP.signum = 15  # a signal during step 0
        assert vote.boundary(True) is False  # boundary 1: acts on boundary 0's vote
        assert vote.boundary(True) is True  # boundary 2: everyone saw the vote of boundary 1
        assert vote.pending is None and vote.votes == 2
        assert vote.boundary(False) is False and vote.pending is None  # last: nothing posted
        vote.finish()
    finally:
        STOP.reset()
        vote.close()
    assert vote.comm == MPI.COMM_NULL


class Served:
    """The parts of a lockstep ``DataServer`` the checkpoint reads, and its ``serve``."""

    def __init__(self, lam: int, total: int, prefetch: int = 2) -> None:
        self.sampler = BatchSampler(50, 4, seed=3)
        self.draws = LockstepDraws(lam, self.sampler.next)
        self.quota = DataQuota(LOCKSTEP, total, lam)
        ranks = [10 + i for i in range(lam)]
        self.ctx = SimpleNamespace(
            layout=SimpleNamespace(learners=ranks), cfg=SimpleNamespace(data=SimpleNamespace(
                batch_size=4)),
        )  # fmt: skip
        self.recent = {r: deque(maxlen=prefetch + 2) for r in ranks}
        self.count = dict.fromkeys(ranks, 0)
        self.consumed: dict[int, int] = {}
        self.served = 0

    def serve(self, learner: int) -> np.ndarray | None:
        if not self.quota.allows(learner):
            return None
        idx = self.draws.take(learner, self.quota.served[learner] - 1)
        rank = self.ctx.layout.learners[learner]
        self.recent[rank].append((self.served, idx))
        self.count[rank] += 1
        self.served += 1
        return idx


def test_lockstep_draws_resume_where_every_learner_computed_on_c_minibatches():
    """λ = 3, each learner computed on 5 minibatches but was served 5, 6 and 7 (its prefetch),
    in an interleaved order: the resumed server hands learner i the k-th minibatches k ≥ 5 of
    the uninterrupted stream (draw kλ + i), and the quota still ends at S."""
    lam, total = 3, 3 * 9
    whole, cut = Served(lam, total), Served(lam, total)
    ahead = {0: 5, 1: 6, 2: 7}
    for k in range(7):
        for i in (2, 0, 1):  # arrival order does not matter
            if k < ahead[i]:
                cut.serve(i)
    cut.consumed = {10 + i: 5 for i in range(lam)}
    state = draws_state(cut)
    # draws 15 … 20: learner 2 was served up to its 7th, draw 6·3 + 2
    assert state.attrs["lockstep_steps"] == 5 and state.arrays["replay"].shape == (7 * 3 - 5 * 3, 4)
    resumed = Served(lam, total)
    restore_draws(resumed, state)
    expect = {i: [whole.serve(i) for _ in range(9)] for i in range(lam)}
    for i in (1, 2, 0):
        for k in range(5, 9):
            assert np.array_equal(resumed.serve(i), expect[i][k]), (i, k)
        assert resumed.serve(i) is None  # S = 9 minibatches each


def test_learners_at_different_steps_are_no_lockstep_cut():
    cut = Served(2, 20)
    for i in (0, 1, 0):
        cut.serve(i)
    cut.consumed = {10: 2, 11: 1}
    with pytest.raises(Exception, match="different steps"):
        draws_state(cut)


def bmuf_block(epochs: int) -> BlockMomentumShard:
    cfg = Config()
    cfg.protocol.name, cfg.protocol.tau, cfg.protocol.block_momentum = "bmuf", 2, 0.5
    cfg.run.epochs, cfg.data.batch_size = epochs, 4
    return BlockMomentumShard.build(np.linspace(-1, 1, 10).astype(np.float32), cfg, 1, 16, np)


def rounds(b: BlockMomentumShard, n: int, seed: int) -> None:
    """``n`` rounds of one local model each, written into the served version as the shard does."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        buf = b.inbox()
        buf[:] = b.serve() + rng.normal(size=10).astype(np.float32) * 0.1
        b.accept([(0, b.ts, None)], buf, 0.0)
        assert b.ready(0.0)
        b.apply(b.commit(), into=b.first_served)
        b.epoch_ends()


def test_a_bmuf_block_restored_serves_the_lookahead_and_continues_as_the_uninterrupted_one():
    """W(t) and Δ(t) are saved (Δ as the rule's state array); the restored block's first
    served version is W_g(t) = W + ηΔ (NBM), not w0, and the next rounds equal the whole run's."""
    short, whole = bmuf_block(1), bmuf_block(2)
    rounds(short, 2, seed=1)
    assert short.done
    arrays, attrs = block_state(short, 0, np.array)
    assert set(arrays) == {"w0", "opt0.delta"}
    resumed = bmuf_block(2)
    restore_block(resumed, 0, arrays, attrs, lambda host, out: np.copyto(out, host))
    assert np.array_equal(resumed.first_served, short.first_served)
    assert not np.array_equal(resumed.first_served, resumed.w)  # the look-ahead
    rounds(whole, 2, seed=1)
    rounds(whole, 2, seed=2)
    rounds(resumed, 2, seed=2)
    assert np.array_equal(resumed.w, whole.w) and resumed.ts == whole.ts == 4


@pytest.mark.parametrize("name", ["sync", "hybrid", "bmuf", "ma"])
def test_the_lockstep_and_block_strategies_are_supported(name):
    cfg = Config()
    cfg.protocol.name = name
    assert unsupported(cfg) is None


def test_gossip_is_supported_too():
    """ADPSGD's learners save their state since issue 14's gossip item (roles/gossip_ckpt)."""
    cfg = Config()
    cfg.protocol.name = "adpsgd"
    assert unsupported(cfg) is None
