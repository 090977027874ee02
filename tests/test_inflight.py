"""The in-flight bound of overlapped learners (pserver/protocols/inflight.py), driven by scripted
events."""

from __future__ import annotations

import pytest

from pserver.protocols.inflight import AUTO_LIMIT, InflightWindow, inflight_limit


def test_auto_is_the_double_buffer_and_explicit_values_stay():
    assert inflight_limit(0) == AUTO_LIMIT == 2
    assert inflight_limit(1) == 1 and inflight_limit(5) == 5
    with pytest.raises(ValueError):
        inflight_limit(-1)
    with pytest.raises(ValueError):
        InflightWindow(0, [0])


def test_limit_one_waits_for_each_push_to_be_acknowledged():
    w = InflightWindow(1, [0])
    assert w.may_compute()  # gradient 0 runs on w0
    w.push()
    assert not w.may_compute() and w.uncovered() == [0]
    w.ask(0)
    assert w.uncovered() == [] and not w.may_compute()
    w.answer(0)
    assert not w.may_compute()  # answered is not enough: the answer must be installed
    w.install()
    assert w.may_compute() and w.unacknowledged() == 0


def test_an_answer_to_a_request_sent_before_a_push_does_not_acknowledge_it():
    w = InflightWindow(2, [0, 1])
    w.push()
    w.ask(0)
    w.ask(1)  # covers push 1
    w.push()  # push 2 travels while the answers to the first requests come
    assert w.unacknowledged() == 2 and not w.may_compute()  # a third would exceed 2
    w.answer(0)
    w.answer(1)
    w.install()
    assert w.unacknowledged() == 1 and w.may_compute()
    w.push()
    assert not w.may_compute()
    assert w.uncovered() == [0, 1]  # ask again: those answers covered only the first push
    for b in (0, 1):
        w.ask(b)
        w.answer(b)
    w.install()
    assert w.unacknowledged() == 0 and w.may_compute()


def test_the_block_furthest_behind_counts():
    w = InflightWindow(1, [0, 1])
    w.push()
    w.ask(0)
    w.answer(0)
    w.install()
    assert w.acked == {0: 1, 1: 0} and w.unacknowledged() == 1 and not w.may_compute()
    assert w.uncovered() == [1]


def test_stopped_blocks_hold_nothing_back():
    w = InflightWindow(1, [0, 1])
    w.push()
    w.ask(0)
    w.ask(1)
    w.answer(0)
    w.stop(1)
    w.install()
    assert w.may_compute() and w.uncovered() == []
    w.stop(0)
    w.push()
    assert w.unacknowledged() == 0 and w.may_compute()


def test_a_scripted_learner_never_exceeds_the_bound_and_never_waits_on_others():
    # the driver's protocol: push, ask every block with no request out, install whatever came,
    # ask again what is still uncovered; answers come in any order, later or at once
    import random

    rng = random.Random(1)
    for limit in (1, 2, 3):
        w = InflightWindow(limit, [0, 1, 2])
        out: set[int] = set()  # requests not yet answered
        came: set[int] = set()  # answers not yet installed
        for _ in range(300):
            while not w.may_compute():  # the wait: only our own requests' answers end it
                assert out or came, "waiting with nothing that could end the wait"
                for b in list(out):
                    if rng.random() < 0.5:
                        out.discard(b)
                        came.add(b)
                        w.answer(b)
                if came and not out:
                    w.install()
                    came.clear()
                    for b in w.uncovered():
                        w.ask(b)
                        out.add(b)
            assert w.unacknowledged() < limit
            w.push()
            assert w.unacknowledged() <= limit
            if not out and not came:
                for b in w.uncovered():
                    w.ask(b)
                    out.add(b)
