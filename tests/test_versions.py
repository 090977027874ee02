"""The version pool (pserver/protocols/versions.py): which buffer a write may go to, who reads
which."""

from __future__ import annotations

import random

import pytest

from pserver.protocols.versions import VersionPool, Write


def test_unread_buffer_is_written_in_place():
    pool = VersionPool(limit=3)
    assert pool.write() == Write(0, None)
    t = pool.pin()
    pool.release(t)
    assert pool.write() == Write(0, None)  # the send completed: no copy, no new buffer
    assert pool.allocated == 1


def test_pinned_buffer_is_copied_on_write_and_freed_on_release():
    pool = VersionPool(limit=3)
    slow = pool.pin()  # a send to a receiver that does not call MPI
    assert pool.write() == Write(1, 0)  # copy the weights to a new buffer, update there
    assert pool.current == 1 and pool.allocated == 2
    fast = pool.pin()
    assert pool.write() == Write(2, 1)
    pool.release(fast)
    assert pool.write() == Write(2, None)  # nobody reads buffer 2 now
    pool.release(slow)
    assert pool.free() in (0, 1)
    assert pool.high_water == 3


def test_write_without_copy_replaces_whole_contents():
    pool = VersionPool(limit=2)
    pool.pin()
    assert pool.write(copy=False) == Write(1, None)


def test_a_stopped_reader_holds_pulls_only_at_the_limit():
    pool = VersionPool(limit=2)
    pool.pin()  # stopped reader on buffer 0
    pool.write()  # update goes to buffer 1
    assert not pool.may_pin()  # pinning 1 would leave no target for the next update ...
    assert pool.write() == Write(1, None)  # ... and the update itself still goes ahead
    with pytest.raises(RuntimeError):
        pool.pin()
    assert VersionPool(limit=3, allocated=1).may_pin()


def test_release_lets_held_pull_through():
    pool = VersionPool(limit=2)
    stopped = pool.pin()
    pool.write()
    assert not pool.may_pin()
    pool.release(stopped)
    assert pool.may_pin()


def test_reserve_for_a_receive_never_takes_current_or_pinned():
    pool = VersionPool(limit=3)
    incoming = pool.reserve()
    assert incoming == 1
    reader = pool.pin()  # a child reads buffer 0 while the parent's model arrives in 1
    pool.publish(incoming)
    assert pool.current == 1
    nxt = pool.reserve()
    assert nxt == 2  # 0 is still read
    assert not pool.may_pin()  # 0 pinned, 2 reserved: only current 1 left
    pool.release(reader)
    assert pool.may_pin()


def test_limit_below_two_is_refused():
    with pytest.raises(ValueError):
        VersionPool(limit=1)


@pytest.mark.parametrize("limit", [2, 3, 5])
@pytest.mark.parametrize("receives", [False, True])
def test_random_schedules_never_write_a_read_buffer(limit, receives):
    """Whatever pins, releases and writes happen, a write never targets a pinned buffer, never
    fails, and the pool stays within its limit (pins only where ``may_pin`` allows)."""
    rng = random.Random(limit * 7 + receives)
    pool = VersionPool(limit=limit)
    incoming = pool.reserve() if receives else None
    readers: dict[int, int] = {}
    for _ in range(5000):
        op = rng.random()
        if op < 0.4 and pool.may_pin():
            readers[pool.pin()] = pool.current
        elif op < 0.7 and readers:
            pool.release(t := rng.choice(list(readers)))
            del readers[t]
        elif receives:
            assert incoming is not None
            assert incoming not in readers.values() and incoming != pool.current
            pool.publish(incoming)
            incoming = pool.reserve()  # may_pin's rule leaves a buffer for the next receive
        else:
            w = pool.write()
            assert w.target not in readers.values()
            assert pool.current == w.target
        assert pool.allocated <= limit
        assert set(readers.values()) <= set(range(pool.allocated))


def test_release_completed_returns_only_the_versions_of_finished_sends():
    from pserver.protocols.versions import VersionPool, release_completed

    class Req:
        def __init__(self, done: bool) -> None:
            self.done = done

        def Test(self) -> bool:  # noqa: N802 - mpi4py's name
            return self.done

    pool = VersionPool(3)
    slow, fast = Req(False), Req(True)
    sends = [(slow, pool.pin()), (fast, pool.pin())]
    assert pool.readers(pool.current) == 2
    assert release_completed(sends, pool) is True
    assert sends == [sends[0]] and sends[0][0] is slow and pool.readers(pool.current) == 1
    assert release_completed(sends, pool) is False
