"""PSP-SGD partial pushing (Algorithm 1, server part) driven by scripted arrival sequences."""

from __future__ import annotations

import math

import pytest

from pserver.protocols.base import Arrival, UpdateDecision
from pserver.protocols.psp import SECOND, STALE, PartialPush
from pserver.protocols.rudra import Hardsync


def push(p: PartialPush, learner: int, ts: int, time: float, server_ts: int) -> bool:
    return p.on_gradient(Arrival(learner, ts, time), server_ts).accept


def simulate(
    p: PartialPush, events: list[tuple[float, int, int]]
) -> list[tuple[float, UpdateDecision]]:
    """A server loop for one block: wake at the next arrival or at the protocol's deadline.

    ``events`` are ``(time, learner, gradient timestamp)`` in time order. Returns the commit
    time and decision of every update.
    """
    ts, out = 0, []
    for time, learner, grad_ts in events:
        deadline = p.deadline()
        if deadline is not None and deadline <= time and p.ready(deadline):
            out.append((deadline, p.commit(ts)))  # the timer fired before this arrival
            ts += 1
        p.on_gradient(Arrival(learner, grad_ts, time), ts)
        if p.ready(time):
            out.append((time, p.commit(ts)))
            ts += 1
    deadline = p.deadline()
    if deadline is not None:
        out.append((deadline, p.commit(ts)))
    return out


def test_cth_arrival_closes_the_round_when_tau1_is_zero() -> None:
    p = PartialPush(n_learners=4, c=3, tau1=0.0)
    for learner in (2, 0):
        assert push(p, learner, 7, 1.0, server_ts=7)
        assert not p.ready(1e9)  # below c nothing but arrivals can help, however long it waits
        assert p.deadline() is None
    assert push(p, 3, 7, 1.5, server_ts=7)
    assert p.ready() and p.ready(0.0)  # tau1 = 0: closed at once, whatever the clock says
    assert p.deadline() == 1.5
    d = p.commit(7)
    assert d.new_timestamp == 8
    assert d.vector_clock == (7, 7, 7) and d.learners == (2, 0, 3)
    assert d.mean_staleness == 0.0
    assert d.divisor == 3.0 and d.lr_scale == 3.0  # line 13: w - d·η·Updater(g/d)
    assert len(p.pending) == 0 and not p.ready(1e9) and p.deadline() is None


def test_stale_gradient_is_dropped_and_not_counted() -> None:
    p = PartialPush(n_learners=2, c=1, tau1=0.0)
    dec = p.on_gradient(Arrival(1, 4, 0.0), server_ts=6)
    assert not dec.accept and dec.staleness == 2 and dec.reason == STALE == "stale: t' < t"
    assert len(p.pending) == 0 and not p.ready(1e9)
    dec = p.on_gradient(Arrival(1, 6, 0.1), server_ts=6)  # the same learner, now on w^6
    assert dec.accept and dec.staleness == 0 and dec.weight == 1.0
    assert p.ready()


def test_stale_push_is_no_response_to_this_round() -> None:
    # The straggler of round 4 pushes its old gradient during round 5: were it counted as a
    # response, "all workers have responded" would close round 5 without its fresh gradient.
    p = PartialPush(n_learners=3, c=2, tau1=100.0)
    assert push(p, 0, 5, 1.0, server_ts=5)
    assert push(p, 1, 5, 2.0, server_ts=5)
    assert not push(p, 2, 4, 3.0, server_ts=5)
    assert not p.ready(50.0)
    assert push(p, 2, 5, 4.0, server_ts=5)
    assert p.ready(4.0)
    assert p.commit(5).vector_clock == (5, 5, 5)


def test_timeout_after_c_has_an_exact_deadline() -> None:
    p = PartialPush(n_learners=4, c=2, tau1=0.5)
    assert push(p, 0, 0, 10.0, server_ts=0)
    assert p.deadline() is None
    assert push(p, 1, 0, 10.25, server_ts=0)
    assert p.deadline() == 10.75  # the timer starts at the c-th gradient, not the first
    assert not p.ready()  # default "now" is the latest arrival, 10.25
    assert not p.ready(10.7499)
    assert p.ready(10.75)
    assert push(p, 3, 0, 10.5, server_ts=0)  # a later arrival does not restart the timer
    assert p.deadline() == 10.75 and not p.ready(10.6)
    d = p.commit(0)
    assert d.learners == (0, 1, 3) and d.divisor == 3.0 and d.lr_scale == 3.0


def test_all_responded_closes_before_the_timeout() -> None:
    p = PartialPush(n_learners=3, c=1, tau1=60.0)
    assert push(p, 2, 0, 0.0, server_ts=0)
    assert p.deadline() == 60.0 and not p.ready(1.0)
    assert push(p, 0, 0, 1.0, server_ts=0)
    assert not p.ready(2.0)
    assert push(p, 1, 0, 2.0, server_ts=0)
    assert p.ready(2.0) and p.ready()
    assert p.commit(0).lr_scale == 3.0


def test_second_gradient_of_a_learner_in_one_round_is_dropped() -> None:
    p = PartialPush(n_learners=3, c=2, tau1=0.0)
    assert push(p, 0, 3, 0.0, server_ts=3)
    dec = p.on_gradient(Arrival(0, 3, 0.1), server_ts=3)
    assert not dec.accept and dec.reason == SECOND and dec.staleness == 0
    assert not p.ready()  # a learner counts once toward c ...
    assert push(p, 1, 3, 0.2, server_ts=3)
    assert p.ready()
    d = p.commit(3)
    assert d.learners == (0, 1) and d.divisor == 2.0
    assert push(p, 0, 4, 0.3, server_ts=4)  # ... and again in the next round


@pytest.mark.parametrize("d", [1, 2, 5, 8])
def test_linear_scaling_rule(d: int) -> None:
    p = PartialPush(n_learners=8, c=1, tau1=1.0)
    for learner in range(d):
        assert push(p, learner, 0, 0.0, server_ts=0)
    dec = p.commit(0)
    assert dec.divisor == dec.lr_scale == float(d)
    # How the driver applies it with plain SGD: lr·lr_scale · (Σg / divisor) = η·Σg, so each
    # learner's gradient moves the weights as far as it would alone (Goyal et al.'s rule).
    grads, eta = [0.5 * (i + 1) for i in range(d)], 0.1
    step = eta * dec.lr_scale * (sum(grads) / dec.divisor)
    assert math.isclose(step, eta * sum(grads))


def test_straggler_timeline() -> None:
    # 4 learners, c = 3, tau1 = 1 s. Learner 3 is slow: in round 0 it misses the deadline
    # (t_c = 2, deadline 3) and its gradient from w^0 lands at 3.5, in round 1: dropped.
    # Round 1 then has learners 0,1,2 at 4, 4.5, 6 (deadline 7) and learner 3's fresh push
    # at 6.5 makes everyone respond: round 1 closes at 6.5 with d = 4.
    p = PartialPush(n_learners=4, c=3, tau1=1.0)
    events = [
        (1.0, 0, 0), (1.5, 1, 0), (2.0, 2, 0),  # round 0: c-th at 2.0
        (3.5, 3, 0),  # after the deadline 3.0: round 1 is open, t' = 0 < 1
        (4.0, 0, 1), (4.5, 1, 1), (6.0, 2, 1), (6.5, 3, 1),  # round 1: all four by 6.5
        (8.0, 1, 2), (8.5, 0, 2), (9.0, 2, 2),  # round 2: learner 3 never comes; timer at 10
    ]  # fmt: skip
    commits = simulate(p, events)
    assert [t for t, _ in commits] == [3.0, 6.5, 10.0]
    assert [d.learners for _, d in commits] == [(0, 1, 2), (0, 1, 2, 3), (1, 0, 2)]
    assert [d.vector_clock for _, d in commits] == [(0, 0, 0), (1, 1, 1, 1), (2, 2, 2)]
    assert [d.lr_scale for _, d in commits] == [3.0, 4.0, 3.0]
    assert all(d.mean_staleness == 0.0 for _, d in commits)


def test_gradient_from_the_future_is_a_driver_bug() -> None:
    p = PartialPush(n_learners=2, c=1, tau1=0.0)
    with pytest.raises(ValueError, match="ahead"):
        p.on_gradient(Arrival(0, 3, 0.0), server_ts=2)


def test_commit_without_gradients_raises() -> None:
    with pytest.raises(ValueError, match="at least one gradient"):
        PartialPush(n_learners=2, c=1, tau1=0.0).commit(0)


@pytest.mark.parametrize(
    ("n", "c", "tau1", "match"),
    [(4, 0, 0.0, "1 <= c"), (4, 5, 0.0, "1 <= c"), (4, 2, -1.0, "tau1"), (4, 2, math.nan, "tau1")],
)
def test_bad_parameters(n: int, c: int, tau1: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PartialPush(n, c, tau1)


def test_contract() -> None:
    p = PartialPush(n_learners=32, c=28, tau1=0.0)  # Table 1's "push:28"
    assert p.waits_for_update
    assert "c=28 of 32" in p.describe()


# -- the iteration rule (PSP-SGD Algorithm 1, worker line 17; protocols/rounds.py) -------------


def tagged(p, learner: int, have: int, iteration: int, server_ts: int, time: float = 0.0):
    return p.on_gradient(Arrival(learner, have, time, iteration), server_ts)


def test_iteration_tag_decides_the_round_and_the_copy_gives_sigma() -> None:
    p = PartialPush(n_learners=3, c=3, tau1=0.0)
    dec = tagged(p, 0, have=3, iteration=5, server_ts=5)  # computed on a kept copy of w^3
    assert dec.accept and dec.staleness == 2  # line 7 looks at t' = 5; σ stays honest
    dec = tagged(p, 1, have=4, iteration=4, server_ts=5)  # an old iteration on old weights
    assert not dec.accept and dec.reason == STALE and dec.staleness == 1
    dec = tagged(p, 1, have=5, iteration=2, server_ts=5)  # a straggler's tag, today's weights
    assert dec.accept and dec.staleness == 0
    assert tagged(p, 2, have=5, iteration=7, server_ts=5).accept  # a tag ahead of the block
    assert p.ready()
    d = p.commit(5)
    assert d.vector_clock == (3, 5, 5) and d.learners == (0, 1, 2)
    assert d.mean_staleness == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="ahead"):  # a copy newer than the block is a bug
        tagged(p, 0, have=7, iteration=7, server_ts=6)


def test_a_learner_that_answered_in_an_earlier_round_has_responded() -> None:
    # c = λ = 2. Learner 0 ran ahead of this block: its iterations 4 and 5 both land in round 4
    # (the second is dropped, but it has answered round 5). Round 5 must not wait for learner
    # 0 again: learner 0 waits for this very block before its iteration 6 (the deadlock).
    p = PartialPush(n_learners=2, c=2, tau1=0.0)
    assert tagged(p, 0, have=4, iteration=4, server_ts=4).accept
    dec = tagged(p, 0, have=4, iteration=5, server_ts=4)
    assert not dec.accept and dec.reason == SECOND
    assert not p.ready()
    assert tagged(p, 1, have=4, iteration=4, server_ts=4).accept
    assert p.ready() and p.commit(4).learners == (0, 1)
    assert not p.ready(1e9)  # a new round never opens with everyone answered (the invariant)
    assert tagged(p, 1, have=5, iteration=5, server_ts=5).accept
    assert p.ready()  # everyone has responded to round 5: close it with d = 1
    d = p.commit(5)
    assert d.learners == (1,) and d.divisor == d.lr_scale == 1.0


def test_stale_tag_is_no_response_under_the_iteration_rule_either() -> None:
    p = PartialPush(n_learners=2, c=2, tau1=0.0)
    assert tagged(p, 0, have=6, iteration=6, server_ts=6).accept
    assert not tagged(p, 1, have=5, iteration=5, server_ts=6).accept
    assert not p.ready(1e9)
    assert tagged(p, 1, have=5, iteration=6, server_ts=6).accept  # kept copy, iteration 6
    assert p.ready()


def test_block_rule_is_the_iteration_rule_with_the_copy_as_tag() -> None:
    # Without a tag the push answers the round of its copy: exactly the per-block rule.
    for p in (PartialPush(n_learners=2, c=2, tau1=0.0), Hardsync(2, 16, 16)):
        assert p.on_gradient(Arrival(0, 3, 0.0), server_ts=3).accept
        assert not p.on_gradient(Arrival(1, 2, 0.0), server_ts=3).accept
        assert not p.ready(1e9)
        assert p.on_gradient(Arrival(1, 3, 0.0), server_ts=3).accept
        assert p.ready()


def test_hardsync_takes_the_iteration_rule_and_averages_what_it_took() -> None:
    p = Hardsync(n_learners=2, batch_size=16, ref_batch=16)
    assert tagged(p, 0, have=2, iteration=3, server_ts=3).accept  # kept copy, σ = 1
    assert not tagged(p, 0, have=2, iteration=4, server_ts=3).accept  # ran ahead: answered
    assert tagged(p, 1, have=3, iteration=3, server_ts=3).accept
    d = p.commit(3)
    assert d.divisor == 2.0 and d.vector_clock == (2, 3)
    assert tagged(p, 1, have=4, iteration=4, server_ts=4).accept
    assert p.ready()  # learner 0 answered round 4 with its second push
    d = p.commit(4)
    assert d.divisor == 1.0 and d.lr_scale == pytest.approx(math.sqrt(2))
