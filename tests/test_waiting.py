"""The back-off wait leaves the CPU idle and reports stalls (one process, no mpiexec)."""

from __future__ import annotations

import logging
import threading
import time

from pserver.comm.waiting import PeerLog, Waiter
from pserver.wire import Header, Tag


def test_idle_wait_burns_little_cpu():
    done = threading.Event()
    timer = threading.Timer(1.0, done.set)
    waiter = Waiter(logging.getLogger("test"), PeerLog(), 1e-5, 1e-3, 60.0)
    timer.start()
    cpu0, wall0 = time.thread_time(), time.monotonic()
    waiter.until(done.is_set, "the timer")
    cpu, wall = time.thread_time() - cpu0, time.monotonic() - wall0
    assert wall >= 0.9
    assert cpu < 0.25 * wall  # a busy-poll would burn ~100% of the wall time
    assert waiter.waited >= 0.9


def test_stall_report_lists_last_messages(caplog):
    peers = PeerLog()
    peers.note(3, Header(Tag.PUSH, 0, 7, 3))
    done = threading.Event()
    timer = threading.Timer(0.3, done.set)
    waiter = Waiter(logging.getLogger("test.stall"), peers, 1e-5, 1e-3, 0.05)
    timer.start()
    with caplog.at_level(logging.WARNING, "test.stall"):
        waiter.until(done.is_set, lambda: "weights of block 0")
    text = caplog.text
    assert "stalled" in text and "waiting for weights of block 0" in text
    assert "rank 3: PUSH(block=0, ts=7, aux=0)" in text
