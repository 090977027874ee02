"""Doorbells: a wait on a crowded node sleeps in the kernel until its peer says "look now".

Neither MPI here sleeps while it waits on shared memory (``pserver.comm.waiting``), so every
wait tests its requests between sleeps, and each test is a wake-up: a crowded node's idle ranks
spent more CPU waking up than their peers had for the work they waited on (docs/performance.md,
*Issue 26, third pass*). Where the peers that can end a wait all ring this rank's doorbell right
after they sent, the wait sleeps on the doorbell (a Linux futex in memory the node's ranks
share) instead of testing on a back-off (``Waiter.until``'s ``rung_by``). The waits that do:
a learner's pull (every reply rings: ``PullAnswers``, the aggregator's and a relaying learner's
reply), the statistics server between reports (rows, snapshots and goodbyes ring it), a rank's
goodbye to the statistics server (it rings back once it took the goodbye).

A send may move only while its sender calls MPI (a message larger than MPI's eager cells goes
in pieces, or waits for the sender to see the receiver's acknowledgement), so a rank never
sleeps on its doorbell with a send of its own in flight that the wait depends on: a learner's
pull sleeps on it only once its pushes are delivered (``quiet``), and a rank's last statistics
rows are waited for on the back-off. Without that rule a learner sleeping with its push in
flight stalled its server until its sleep timed out (docs/performance.md has the figures).

A doorbell is a 32-bit counter per rank of the node in an MPI shared window. ``ring`` adds one
and wakes every thread of that rank sleeping on it; a waiter reads the counter *before* it tests
its requests and sleeps only while the counter still holds that value, so a ring between the
test and the sleep is never missed. A ring from two peers at once may add one instead of two
(no atomic add from Python): the counter changed all the same, and the wake-up follows the
write, so no sleeper stays asleep.

Liveness: a doorbell only shortens a sleep. Every sleep on it is bounded by the back-off's
ceiling (``Backoff.ceiling``), so a ring that never comes (a peer on another node, a path
that does not ring) costs at most the latency an idle wait already had, never a hang.

Built only where it pays and works: a node with more ranks than cores (``crowding`` > 1,
agreed by the node's ranks), Linux with a known futex system call number, and no ULFM (a
shared window's ``Free`` is collective over the node, which a lost learner would block).
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

#: futex(2)'s system call number per machine (asm/unistd.h); elsewhere no doorbells
SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221,
             "ppc64": 221, "s390x": 238, "riscv64": 98}  # fmt: skip
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAKE_ALL = 2**31 - 1
LINE = 64  # bytes per counter: one cache line, so a ring does not disturb a neighbour's word


_current: Doorbells | None = None  # this process's doorbells, while the run has them


def ring(rank: int) -> None:
    """Ring ``rank``'s doorbell after sending it what one of its waits is ``rung_by``
    (``Waiter.until``): :meth:`Doorbells.ring` of this process's doorbells; nothing where the
    run has none (an uncrowded node, ``comm.crowded = "off"``, ULFM)."""
    if _current is not None:
        _current.ring(rank)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def futex_call() -> Any | None:
    """``syscall`` and futex's number here, or None (not Linux, or an unknown machine)."""
    nr = SYS_FUTEX.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or nr is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall, nr


class Doorbells:
    """One counter per rank of this node, in a shared window; see the module's docstring."""

    def __init__(self, win: MPI.Win, node: MPI.Comm, world_ranks: list[int], me: int) -> None:
        call = futex_call()
        assert call is not None
        self._syscall, self._nr = call
        self.win, self.node = win, node
        self.words: dict[int, np.ndarray] = {}
        self.addr: dict[int, int] = {}
        for node_rank, world_rank in enumerate(world_ranks):
            buf, _ = win.Shared_query(node_rank)
            word = np.frombuffer(buf, dtype=np.uint32, count=1)
            self.words[world_rank] = word
            self.addr[world_rank] = word.ctypes.data
        self.me = me
        self.rings = 0  # rings sent, for tests and the curious

    @classmethod
    def create(cls, world: MPI.Comm, crowded: bool) -> Doorbells | None:
        """Collective over ``world``: doorbells for this node's ranks where every rank of the
        node is ``crowded`` and can call futex; None elsewhere (every rank of a node agrees)."""
        node = world.Split_type(MPI.COMM_TYPE_SHARED)
        able = crowded and futex_call() is not None
        if not node.allreduce(able, op=MPI.LAND):
            node.Free()
            return None
        win = MPI.Win.Allocate_shared(LINE, 1, comm=node)
        buf, _ = win.Shared_query(node.Get_rank())
        np.frombuffer(buf, dtype=np.uint32, count=1)[0] = 0
        ranks = node.allgather(world.Get_rank())
        node.Barrier()  # every counter is zeroed before anyone rings
        global _current
        _current = cls(win, node, ranks, world.Get_rank())
        return _current

    def covers(self, ranks: Any) -> bool:
        """Whether every rank of ``ranks`` can ring this one (they share its node)."""
        return all(r in self.words for r in ranks)

    def seen(self) -> int:
        """This rank's counter now: read it before testing what the wait is for."""
        return int(self.words[self.me][0])

    def ring(self, rank: int) -> None:
        """Wake ``rank``'s waits (after this rank sent what they wait for); a rank on another
        node has no doorbell here: nothing happens, its wait ends by its back-off."""
        word = self.words.get(rank)
        if word is None:
            return
        word[0] = (int(word[0]) + 1) & 0xFFFFFFFF
        self._syscall(self._nr, ctypes.c_void_p(self.addr[rank]), FUTEX_WAKE, WAKE_ALL,
                      None, None, 0)  # fmt: skip
        self.rings += 1

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until this rank's counter differs from ``seen`` (a ring), or ``timeout`` s.
        Returns at once when it already differs; a signal or spurious wake-up ends it early,
        which the caller's next test absorbs."""
        ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
        self._syscall(self._nr, ctypes.c_void_p(self.addr[self.me]), FUTEX_WAIT,
                      ctypes.c_uint32(seen), ctypes.byref(ts), None, 0)  # fmt: skip

    def free(self) -> None:
        """Collective over the node: release the window (after the training's last ring)."""
        global _current
        if _current is self:
            _current = None
        self.words.clear()
        self.win.Free()
        self.node.Free()
