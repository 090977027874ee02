"""The back-off of every wait (:class:`Backoff`) and how a crowded node stretches it: pure policy,
no MPI, so the simulator (``pserver.sim.costs``) drives the very rule the ranks sleep by.

A wait tests its requests a few times, then sleeps between tests, each sleep ``BACKOFF`` of
the time waited so far within ``comm.poll_min`` … ``comm.poll_max`` (``pserver.comm.waiting``
does the tests and sleeps; docs/architecture.md, *Waiting without burning a core*, says why).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

SPIN_TESTS = 64  # tests before the first sleep: a reply already on its way costs no sleep
BACKOFF = 0.125  # each sleep is this share of the time waited so far (within poll_min..poll_max)
#: the longest sleep crowding may stretch comm.poll_max to (crowded_poll_max): a message to an
#: idle rank is seen at most this late
MAX_CROWDED_POLL = 0.02
#: the ceiling of a wait that has lasted LONG_WAIT s (long_poll_max): per rank per core, and
#: at most MAX_LONG_POLL; a shorter wait keeps poll_max (crowded), so busy waits are unchanged
LONG_POLL = 0.02
MAX_LONG_POLL = 0.1
LONG_WAIT = 0.1


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; else the machine's count)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not Linux
        return max(os.cpu_count() or 1, 1)


def crowded_poll_max(poll_max: float, ranks_here: int, cores: int | None = None) -> float:
    """The longest sleep of a wait on a node where ``ranks_here`` ranks share ``cores`` cores:
    ``poll_max`` times the ranks per core when there are more ranks than cores, else
    ``poll_max``, never above ``MAX_CROWDED_POLL``.

    Every test of an idle rank costs CPU (a Python call and ``MPI_Test``); with ``poll_max``
    alone, a hundred ranks on two cores woke so often that their tests took more CPU than the
    compute they waited for (docs/performance.md, *Learners on two cores*, has the figures and
    ``scripts/bench_scaling.py`` measures them). Scaled, the node's wake-ups stay about
    ``cores / poll_max`` per second whatever the number of ranks, and the added latency is
    what a crowded node's scheduler already imposes: with r ranks per core a woken rank waits
    for its turn on a core behind up to r others anyway.
    """
    crowd = crowding(ranks_here, cores)
    return min(poll_max * crowd, max(poll_max, MAX_CROWDED_POLL))


def long_poll_max(poll_max: float, ranks_here: int, cores: int | None = None) -> float:
    """The longest sleep of a wait that has already lasted long: ``LONG_POLL`` times the ranks
    per core, at most ``MAX_LONG_POLL``, never below ``poll_max``.

    It applies once a wait has lasted ``LONG_WAIT`` (0.1 s): a shorter wait (a busy rank's: a
    pull's reply, the next minibatch) sleeps as before, and each sleep is still ``BACKOFF``
    (1/8) of the time waited, so the latency a long wait adds stays within 1/8 of its length.
    An idle rank (a learner waiting for a slow peer, a server between requests) then wakes
    every ``LONG_POLL`` instead of every ``poll_max``: each wake-up costs CPU (a test, the
    Python around it, a context switch), which made an idle rank's share of a core the
    largest cost of a crowded node (docs/performance.md, *An idle rank's CPU*, has the
    figures; ``scripts/bench_scaling.py --only idle`` measures them).
    """
    return max(poll_max, min(LONG_POLL * crowding(ranks_here, cores), MAX_LONG_POLL))


def crowded_spin(ranks_here: int, cores: int | None = None) -> int:
    """The tests a wait makes before its first sleep: ``SPIN_TESTS`` divided by the ranks per
    core. Spinning pays when the reply is on its way from another core; on a crowded node the
    peer that must send it needs the very core the spinning rank holds (docs/performance.md,
    *Learners on two cores*)."""
    return max(1, int(SPIN_TESTS / crowding(ranks_here, cores)))


def crowding(ranks_here: int, cores: int | None = None) -> float:
    """Ranks per core on this node, at least 1."""
    cores = usable_cores() if cores is None else max(cores, 1)
    return max(ranks_here / cores, 1.0)


class Backoff:
    """The one back-off of the code base: ``SPIN_TESTS`` tests without sleeping (a reply already
    on its way costs no sleep; ``spin`` of them, :func:`crowded_spin` on a crowded node), then
    each sleep ``BACKOFF`` of the time idle so far, within ``lo`` … ``hi`` (``comm.poll_min``
    … ``comm.poll_max``, :func:`crowded_poll_max` on a crowded node). Used by :class:`Waiter`
    and by the communication thread of :class:`pserver.comm.engine.CommEngine`.

    ``tight`` seconds (default 0): a transfer expected to take about that long is under way and
    moves on only while this rank tests it (MPICH progresses a non-blocking collective inside
    MPI calls only), so for that long every sleep is ``lo``; the idle time that sets the later
    sleeps counts from the window's end. The window is finite, so an idle rank still ends up
    sleeping ``hi`` between tests; with ``tight = 0`` the rule is the one above.

    ``long`` (default ``hi``): the ceiling once the wait has been idle ``LONG_WAIT`` s
    (:func:`long_poll_max`); shorter waits are unchanged.
    """

    def __init__(
        self,
        lo: float,
        hi: float,
        tight: float = 0.0,
        spin: int | None = None,
        long: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.lo, self.hi = lo, hi
        self.spin = SPIN_TESTS if spin is None else spin
        self.long = max(hi, long or hi)
        self.clock = clock  # None: time.monotonic, looked up at each call
        self.restart(tight)

    def now(self) -> float:
        return (self.clock or time.monotonic)()

    def restart(self, tight: float = 0.0) -> None:
        """Something happened: the next tests spin again (and poll tightly for ``tight`` s)."""
        self.tests, self.since, self.tight = 0, self.now(), max(tight, 0.0)

    def ceiling(self) -> float:
        """The longest sleep now: ``hi``, or ``long`` once the wait has been idle
        ``LONG_WAIT`` s (a doorbell's wait sleeps this long unless rung)."""
        idle = self.now() - self.since - self.tight
        return self.long if idle >= LONG_WAIT else self.hi

    def next_sleep(self) -> float:
        """Seconds to sleep before the next test (0.0 while still spinning)."""
        self.tests += 1
        if self.tests < self.spin:
            return 0.0
        idle = self.now() - self.since - self.tight
        return min(max(BACKOFF * idle, self.lo), self.long if idle >= LONG_WAIT else self.hi)
