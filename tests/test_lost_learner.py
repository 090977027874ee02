"""Issue 22, item 1, in one process: the protocols' ``lose`` (quorums for λ − 1), the strategies
that survive a lost learner, the ``learners_lost`` record in the dump's check and summary, and
when ULFM counts as on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pserver.comm.collectives import reconcile
from pserver.comm.departures import ulfm_enabled
from pserver.dump.check import check_dump
from pserver.dump.reader import Dump, summarize
from pserver.plan.config import load_config
from pserver.protocols.base import Arrival
from pserver.protocols.block import BlockRound
from pserver.protocols.bmuf_block import BlockMomentumShard
from pserver.protocols.psp import PartialPush
from pserver.protocols.rudra import Hardsync, Softsync
from pserver.protocols.ssp import StaleSynchronous
from pserver.strategies import survives_lost_learner


def push(proto, learner: int, ts: int = 0):  # noqa: ANN001, ANN201
    return proto.on_gradient(Arrival(learner, ts), ts)


def test_hardsync_round_closes_with_the_three_left_and_rescales_the_rate():
    p = Hardsync(4, batch_size=16, ref_batch=16)
    for k in (0, 1):
        assert push(p, k).accept
    assert not p.ready()
    p.lose(3)  # learner 3 died before pushing: the round waits for 0, 1, 2 only
    assert not p.ready()
    push(p, 2)
    assert p.ready()
    d = p.commit(0)
    assert d.divisor == 3 and sorted(d.learners) == [0, 1, 2]
    assert p.lr_scale == pytest.approx(math.sqrt(3))  # Rudra §III-B with λ = 3
    for k in (0, 1):  # the next round needs all three survivors
        push(p, k, 1)
    assert not p.ready()
    push(p, 2, 1)
    assert p.ready()


def test_hardsync_a_dead_learners_gradient_does_not_stand_for_a_live_one():
    p = Hardsync(4, batch_size=16, ref_batch=16)
    for k in (0, 1, 3):
        push(p, k)
    p.lose(3)  # its gradient is in the round, but learner 2 has not answered
    assert not p.ready()
    push(p, 2)
    assert p.ready() and p.commit(0).divisor == 4  # the dead one's complete gradient is kept
    p.lose(3)  # reported twice (shard and a second wait): counted once
    assert p.n_learners == 3


def test_async_stays_async_and_softsync_recomputes_its_count():
    a = Softsync(4, 4, "nominal")
    a.lose(2)
    assert (a.n, a.count, a.n_learners) == (3, 1, 3)
    assert a.lr_scale(0) == pytest.approx(1 / 3)  # eq. (6): α0/n with n = λ − 1
    s = Softsync(4, 1, "nominal")  # c = λ = 4 gradients per update
    s.lose(0)
    assert (s.n, s.count) == (1, 3)
    for k in (1, 2):
        push(s, k)
    assert not s.ready()
    push(s, 3)
    assert s.ready()
    t = Softsync(4, 4, "nominal")
    t.lose(1)
    t.lose(1)
    assert t.n_learners == 3


def test_ssp_forgets_the_dead_learners_clock():
    p = StaleSynchronous(3, 1, "none")
    for _ in range(2):
        push(p, 0)
    assert not p.pull_ready(0)  # learner 0 is 2 ahead of learners 1 and 2
    push(p, 1)
    push(p, 1)
    assert not p.pull_ready(0)  # still held back by learner 2's frozen clock
    p.lose(2)
    assert p.pull_ready(0) and p.n_learners == 2


def test_psp_caps_c_and_closes_rounds_of_the_survivors():
    p = PartialPush(3, 3, 0.0)
    push(p, 0)
    push(p, 1)
    assert not p.ready()
    p.lose(2)
    assert p.c == 2 and p.ready()


def test_block_round_averages_the_others_at_the_same_rate():
    p = BlockRound(3, 4)
    p.lose(0)
    push(p, 1)
    push(p, 2)
    assert p.ready()
    d = p.commit(0)
    assert d.divisor == 2 and d.lr_scale == 1.0


@pytest.mark.parametrize("name", ["async", "softsync", "hardsync", "psp", "ssp"])
def test_parameter_server_strategies_survive_without_trees_windows_or_pauses(name):
    assert survives_lost_learner(load_config(None, [f"protocol.name={name}"]))
    extras = ["comm.transport=\"shm\"", "run.checkpoint_interval=5"]
    if name not in ("psp", "ssp"):  # they refuse a tree already
        extras.append("cluster.tree_fanout=2")
    for extra in extras:
        assert not survives_lost_learner(load_config(None, [f"protocol.name={name}", extra]))


@pytest.mark.parametrize("name", ["sync", "hybrid", "bmuf", "ma"])  # adpsgd: test_lost_ring.py
def test_collective_and_model_averaging_strategies_survive_without_pauses(name):
    assert survives_lost_learner(load_config(None, [f"protocol.name={name}"]))
    paused = load_config(None, [f"protocol.name={name}", "run.checkpoint_interval=5"])
    assert not survives_lost_learner(paused)


# -- SYNC/HYBRID: the survivors' reconciliation after a regroup ------------------------------------


def test_reconcile_redoes_the_step_every_survivor_is_at():
    assert reconcile([7, 7, 7]) == (7, 7, 0)  # nobody completed step 7's sum: all redo it


def test_reconcile_sends_the_completed_sum_from_the_first_survivor_ahead():
    # survivor 1 and 2 completed step 7's sum (the dead learner's gradient is in it), 0 did not
    assert reconcile([7, 8, 8]) == (7, 8, 1)
    assert reconcile([8, 7, 8]) == (7, 8, 0)


def test_reconcile_refuses_survivors_two_steps_apart():
    with pytest.raises(ValueError, match="drifted apart"):
        reconcile([5, 7])


# -- BMUF/MA: the block average after a loss -------------------------------------------------


def bmuf_shard(overrides: list[str], n_learners: int = 4) -> BlockMomentumShard:
    cfg = load_config(None, ["protocol.tau=2", *overrides])
    return BlockMomentumShard.build(np.zeros(1), cfg, n_learners, train_size=100, xp=np)


def deliver(b: BlockMomentumShard, learner: int, model: float) -> None:
    buf = b.inbox()
    buf[...] = model
    assert b.accept([(learner, b.ts, None)], buf, 0.0).accepted
    b.keep()


def test_bmuf_block_averages_the_three_left_and_recomputes_eta():
    """Learner 3 dies before its delta of block 1: the round closes with three, W̄ is their
    mean (eq. 2 over λ − 1) and η = 1 − 1/λ (eq. 10) becomes 2/3."""
    b = bmuf_shard(["protocol.name=bmuf", "protocol.nesterov=false"])
    assert b.rule.filter.eta == 0.75
    for k, m in ((0, 1.0), (1, 2.0)):
        deliver(b, k, m)
    b.protocol.lose(3)
    assert not b.ready(0.0)
    deliver(b, 2, 6.0)
    assert b.ready(0.0)
    d = b.commit()
    assert d.divisor == 3
    b.apply(d)
    assert b.rule.filter.eta == pytest.approx(2 / 3)
    assert b.w[0] == pytest.approx(3.0)  # Δ(0) = 0: W(1) = W̄(1) = (1 + 2 + 6) / 3, ζ = 1
    assert b.rule.delta[0] == pytest.approx(3.0)


def test_bmuf_keeps_an_eta_the_config_set_and_ma_stays_an_average():
    b = bmuf_shard(["protocol.name=bmuf", "protocol.block_momentum=0.5"])
    b.protocol.lose(0)
    for k in (1, 2, 3):
        deliver(b, k, 3.0)
    b.apply(b.commit())
    assert b.rule.filter.eta == 0.5
    ma = bmuf_shard(["protocol.name=ma"])
    ma.protocol.lose(1)
    for k, m in ((0, 1.0), (2, 2.0), (3, 6.0)):
        deliver(ma, k, m)
    ma.apply(ma.commit())
    assert ma.rule.filter.eta == 0.0 and ma.w[0] == pytest.approx(3.0)  # W(t) = W̄(t)


def test_bmuf_a_dead_learners_whole_delta_stays_in_its_round():
    b = bmuf_shard(["protocol.name=ma"])
    for k, m in ((0, 1.0), (3, 5.0)):
        deliver(b, k, m)
    b.protocol.lose(3)  # its delta arrived whole before it died
    for k, m in ((1, 2.0), (2, 4.0)):
        deliver(b, k, m)
    d = b.commit()
    assert d.divisor == 4
    b.apply(d)
    assert b.w[0] == pytest.approx(3.0)


def test_ulfm_is_open_mpi_launched_with_fault_tolerance():
    assert ulfm_enabled("Open MPI v5.0.11, ...", {"OMPI_MCA_mpi_ft_enable": "1"})
    assert not ulfm_enabled("Open MPI v5.0.11, ...", {})
    assert not ulfm_enabled("MPICH Version: 5.0.2", {"OMPI_MCA_mpi_ft_enable": "1"})


# -- the dump: learners_lost rows, check and summary ---------------------------------------------


def dump(lost: dict | None, ended=(0, 1, 3), steps=None, n_learners=4) -> Dump:  # noqa: ANN001
    """A small dump: learners 0..3 with train rows, end rows for ``ended``, and ``lost``."""
    steps = steps or {0: 5, 1: 5, 2: 3, 3: 5}
    learner = np.concatenate([np.full(n, k) for k, n in steps.items()])
    step = np.concatenate([np.arange(n) for n in steps.values()])
    groups = {
        "train": {"learner": learner, "step": step, "loss": np.ones(len(step))},
        "learners": {"learner": np.array(ended),
                     "minibatches": np.array([steps[k] for k in ended])},
    }
    if lost is not None:
        groups["learners_lost"] = {k: np.array([v]) for k, v in lost.items()}
    attrs = {"finished": "now", "wall_time": 1.0, "n_learners": n_learners}
    groups["model"] = {"weights": np.zeros(3)}
    return Dump(Path("x.h5"), attrs, groups)


LOST = {"learner": 2, "rank": 5, "time": 0.8, "last_step": 2, "learners": 3}


def test_check_accepts_a_recorded_loss_and_flags_a_silent_one():
    assert check_dump(dump(LOST)) == []
    assert any("not recorded lost" in p for p in check_dump(dump(None)))
    assert check_dump(dump({**LOST, "last_step": 4})) == []  # its last rows died unsent
    assert any("last step 1" in p for p in check_dump(dump({**LOST, "last_step": 1})))
    assert any("λ = 4 after the loss" in p for p in check_dump(dump({**LOST, "learners": 4})))
    with_end = dump(LOST, ended=(0, 1, 2, 3))
    assert any("has an end-of-run row" in p for p in check_dump(with_end))


def test_summary_lists_the_losses():
    s = summarize(dump(LOST))
    assert s["learners_lost"] == [LOST]
    assert summarize(dump(None, ended=(0, 1, 2, 3)))["learners_lost"] == []


# -- the shard: a pull answer to a lost learner --------------------------------------------------


class FailedSend:
    """A send whose receiver died: its test fails once, then finds it freed (completed)."""

    def __init__(self) -> None:
        self.tests = 0

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        from mpi4py import MPI

        self.tests += 1
        if self.tests == 1:
            raise MPI.Exception(MPI.ERR_PROC_FAILED)
        return True


def versions():  # noqa: ANN201
    from pserver.roles.shard_versions import ServedVersions

    v = ServedVersions(0, 3, [np.zeros(2)], lambda i: np.zeros(2), np)
    v.pin_send(FailedSend())
    return v


def test_a_send_to_a_lost_learner_completes_once_the_loss_is_absorbed():
    from mpi4py import MPI

    with pytest.raises(MPI.Exception):  # no ULFM (or not a learner): the error stands
        versions().collect()
    v = versions()
    seen: list[int] = []
    v.absorb = lambda error: seen.append(error.Get_error_class()) is None
    assert v.collect() and not v.inflight  # the version it pinned is free again
    assert seen == [MPI.ERR_PROC_FAILED]
