"""The pull-answer rule (pserver/protocols/pull.py), every outcome, in one process."""

from __future__ import annotations

from pserver.comm.wire import Reply
from pserver.protocols.pull import pull_answer


def answer(**kw):
    args = dict(stopped=False, ts=3, holds=1, accepts=0)
    args.update(kw)
    return pull_answer(**args)


def test_newer_weights_are_sent():
    assert answer() is Reply.WEIGHTS


def test_stop_wins_over_everything():
    assert answer(stopped=True, ts=0, accepts=5, ready=lambda: False) is Reply.STOP


def test_held_while_older_than_accepted():
    assert answer(ts=3, accepts=4) is None  # hardsync / PSP / long poll: the next update
    assert answer(ts=4, accepts=4, holds=3) is Reply.WEIGHTS


def test_held_while_the_protocol_holds_the_puller_back():
    assert answer(ready=lambda: False) is None  # SSP's bound
    assert answer(ready=lambda: True) is Reply.WEIGHTS


def test_protocol_not_asked_when_already_decided():
    def never() -> bool:
        raise AssertionError("pull_ready asked needlessly")

    assert answer(stopped=True, ready=never) is Reply.STOP
    assert answer(accepts=9, ready=never) is None


def test_current_copy_gets_no_payload():
    assert answer(ts=3, holds=3) is Reply.CURRENT


def test_in_place_reader_of_a_current_copy_pins_it():
    assert answer(ts=3, holds=3, reads=True) is Reply.WEIGHTS
