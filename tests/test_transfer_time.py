"""The tight window of a collective's wait: how long it should take (pure), and the back-off
that polls at its shortest sleep for that long, then backs off as every wait does."""

from __future__ import annotations

import pytest

from pserver.comm import backoff
from pserver.comm.backoff import Backoff
from pserver.comm.transfer_time import INITIAL_BYTES_PER_S, TransferClock

MIB = 2**20


def test_before_any_sample_the_window_uses_the_initial_bandwidth():
    clock = TransferClock(factor=2.0)
    assert clock.bandwidth == INITIAL_BYTES_PER_S
    assert clock.window(16 * MIB) == pytest.approx(2.0 * 16 * MIB / INITIAL_BYTES_PER_S)


def test_the_window_is_factor_times_bytes_over_the_best_recent_bandwidth():
    clock = TransferClock(factor=2.0, history=4)
    clock.observe(16 * MIB, 0.016)  # 1 MiB/ms
    clock.observe(16 * MIB, 0.008)  # the best: 2 MiB/ms
    clock.observe(16 * MIB, 0.032)
    assert clock.bandwidth == pytest.approx(2 * MIB / 1e-3)
    assert clock.window(16 * MIB) == pytest.approx(2.0 * 0.008)
    assert clock.window(4 * MIB) == pytest.approx(2.0 * 0.002)  # scales with the bytes


def test_a_late_peer_never_lengthens_the_window():
    clock = TransferClock(factor=2.0)
    clock.observe(16 * MIB, 0.010)
    before = clock.window(16 * MIB)
    clock.observe(16 * MIB, 2.0)  # this one waited two seconds for a late rank
    assert clock.window(16 * MIB) == before


def test_a_slower_machine_is_learned_after_history_samples():
    clock = TransferClock(factor=1.0, history=3)
    clock.observe(MIB, 0.001)
    for _ in range(3):
        clock.observe(MIB, 0.004)
    assert clock.window(MIB) == pytest.approx(0.004)


def test_factor_zero_is_no_window_and_empty_samples_are_ignored():
    clock = TransferClock(factor=0.0)
    clock.observe(MIB, 0.001)
    assert clock.window(MIB) == 0.0
    clock = TransferClock()
    clock.observe(0, 0.001)  # an empty allreduce
    clock.observe(MIB, 0.0)  # a clock that did not move
    assert clock.bandwidth == INITIAL_BYTES_PER_S


@pytest.mark.parametrize("kw", [{"factor": -1.0}, {"initial": 0.0}, {"history": 0}])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError, match="need factor"):
        TransferClock(**kw)


def test_backoff_polls_at_its_floor_for_the_tight_window_then_backs_off(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(backoff.time, "monotonic", lambda: clock[0])
    b = Backoff(1e-5, 1e-3, tight=0.010)
    assert [b.next_sleep() for _ in range(backoff.SPIN_TESTS - 1)] == [0.0] * (
        backoff.SPIN_TESTS - 1
    )
    clock[0] += 0.009  # inside the window: without it this would already be 1e-3 (capped)
    assert b.next_sleep() == 1e-5
    clock[0] += 0.001 + 0.004  # 4 ms past the window's end: idle time counts from there
    assert b.next_sleep() == pytest.approx(backoff.BACKOFF * 0.004)
    clock[0] += 10.0
    assert b.next_sleep() == 1e-3  # the window is finite: an idle rank sleeps the ceiling
    b.restart()  # a completion: no window unless one is given again
    assert b.tight == 0.0


def test_backoff_without_a_window_is_the_rule_before(monkeypatch):
    clock = [5.0]
    monkeypatch.setattr(backoff.time, "monotonic", lambda: clock[0])
    for tight in (0.0, -1.0):  # none, or a window already past
        b = Backoff(1e-5, 1e-3, tight)
        for _ in range(backoff.SPIN_TESTS - 1):
            b.next_sleep()
        clock[0] += 0.004
        assert b.next_sleep() == pytest.approx(backoff.BACKOFF * 0.004)
