"""Waiting without burning a core, and saying what a stalled rank waits for.

MPICH's blocking calls busy-poll: a rank blocked in ``Recv`` takes a core away from the learners
that share its node (docs/architecture.md, "Waiting without burning a core", has the figures and
``scripts/bench_wait.py`` measures them). Every wait here tests its requests a few times, then
sleeps with back-off between ``comm.poll_min`` and ``comm.poll_max``, which adds at most
``poll_max`` of latency and leaves the compute the CPU. The back-off itself (when to test,
how long to sleep) is pure policy in :mod:`pserver.comm.backoff`, which the simulator shares;
``usable_cores`` is re-exported here for the statistics server.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence

from mpi4py import MPI

from pserver.comm.backoff import Backoff, long_poll_max
from pserver.comm.backoff import usable_cores as usable_cores  # re-exported for roles/
from pserver.comm.departures import Departures, is_failure
from pserver.comm.doorbell import Doorbells
from pserver.comm.liveness import Roster
from pserver.comm.wire import Header
from pserver.errors import PeerLost

LIVENESS_PERIOD = 1.0  # a wait this long checks, once per period, that no peer has died
EXIT_GRACE = 1.0  # after an MPI error, how long a dying peer may take to show as ended
#: PeerLog's name for what an allreduce brings: one message from the whole learner group
ALLREDUCE_PEERS = "the learners' allreduce"
SUSPENDED = 1.0  # a sleep ending this much later than asked: the process did not run (StallClock)
ABSORB_RETRIES = 16  # tests of one wait that may each end in a lost learner's error (ULFM)
PR_SET_TIMERSLACK = 29  # prctl(2)
TIMER_SLACK_NS = 1000

_slack = threading.local()


def tighten_timer_slack() -> None:
    """Lower this thread's timer slack (Linux; default 50 µs) so short sleeps end on time."""
    if getattr(_slack, "done", False):
        return
    _slack.done = True
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: sleeps are just less punctual
            pass


class PeerLog:
    """What this rank last received from each peer, for the stall report; with a ``roster``
    (the process of every rank, :mod:`pserver.comm.liveness`) also which peers have died, and
    ``names`` says what a rank is ("server 0")."""

    def __init__(
        self, roster: Roster | None = None, names: Callable[[int], str] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, tuple[str, float]] = {}
        self._t0 = time.monotonic()
        self.roster, self.names = roster, names
        #: lost learners the run survives (Open MPI's ULFM, :mod:`pserver.comm.departures`)
        self.departures: Departures | None = None
        #: this node's doorbells (:mod:`pserver.comm.doorbell`); None: every wait backs off
        self.bells: Doorbells | None = None
        self.fatal: list[int] = []  # failed ranks the run cannot survive (ULFM names them)

    def note(self, peer: int | str, what: Header | str) -> None:
        """``what`` just arrived from ``peer``: a world rank, or a label for what a collective
        brought from a whole group ("the learners' allreduce")."""
        with self._lock:
            self._last[peer] = (str(what), time.monotonic())

    def report(self) -> str:
        """Each peer's last message and how long ago it came, e.g. ``rank 3 (learner 1):
        PUSH(block=0, ts=7, aux=0), 2.4 s ago``."""
        with self._lock:
            items = sorted(self._last.items(), key=lambda kv: str(kv[0]))
        if not items:
            return f"nothing received in the {time.monotonic() - self._t0:.1f} s since start"
        now = time.monotonic()
        return "; ".join(f"{self._who(p)}: {w}, {now - t:.1f} s ago" for p, (w, t) in items)

    def _who(self, peer: int | str) -> str:
        if isinstance(peer, str):
            return peer
        return f"rank {peer} ({self.names(peer)})" if self.names is not None else f"rank {peer}"

    def dead(self) -> list[int]:
        """Peers on this node whose process has ended (none known without a roster), less
        the learners whose loss the run survives: MPI's failure detector reports those."""
        dead = self.roster.dead() if self.roster is not None else []
        if self.departures is not None:
            dead = [r for r in dead if r not in self.departures.learners]
        return dead

    def absorb(self, error: BaseException, log: logging.Logger | None = None) -> bool:
        """Whether ``error`` is the failure of learners the run survives (ULFM): then they
        are acknowledged, noted as lost (``departures``) and the wait may test again."""
        d = self.departures
        if d is None or not is_failure(error):
            return False
        new, fatal = d.absorb()
        if fatal:
            self.fatal = fatal
            return False
        for r in new:
            if log is not None:
                log.warning("lost %s: its process failed (MPI: %s); the run goes on without "
                            "it", self.name(r), mpi_error_summary(error))
        return bool(d.lost())

    def name(self, rank: int) -> str:
        parts = [self.names(rank)] if self.names is not None else []
        if self.roster is not None:
            parts.append(self.roster.where(rank))
        return f"rank {rank} ({', '.join(parts)})" if parts else f"rank {rank}"

    def last_from(self, rank: int) -> str:
        with self._lock:
            got = self._last.get(rank)
        return f"{got[0]}, {time.monotonic() - got[1]:.1f} s ago" if got else "nothing"

    def lost(self, what: str | None, error: BaseException | None = None) -> PeerLost:
        """The error to raise when a peer died (``dead()``) or MPI failed while waiting.

        After an MPI error the dead peer may still be exiting (its memory already gone, which
        is what the error says, its process not yet a zombie): it is looked for again for up
        to ``EXIT_GRACE`` seconds before the report gives up naming it.
        """
        dead = self.fatal or self.dead()
        deadline = time.monotonic() + EXIT_GRACE
        look = error is not None and self.roster is not None
        while look and not dead and time.monotonic() < deadline:
            time.sleep(0.01)  # bounded: the failure is certain, only its name is awaited
            dead = self.dead()
        during = f" while waiting for {what}" if what else ""
        said = f" (MPI: {mpi_error_summary(error)})" if error is not None else ""
        if dead:
            first = dead[0]
            if len(dead) == 1:
                who = f"lost {self.name(first)}, whose process has ended: it failed first"
            else:
                names = ", ".join(self.name(r) for r in dead)
                who = f"lost {names}, whose processes have ended: one of them failed first"
            return PeerLost(
                f"{who}{during}{said}; last received from rank {first}: {self.last_from(first)}"
            )
        unknown = "every rank" if self.roster is None else "ranks on other nodes"
        return PeerLost(
            f"got an MPI error{during}{said}; no rank this one can check has ended ({unknown} "
            f"cannot be checked from here); last received: {self.report()}",
            named=False,
        )


def mpi_error_summary(error: BaseException) -> str:
    """MPICH's error stack in one line: its class and the innermost cause.

    ``Other MPI error, error stack:\ninternal_Test(109): MPI_Test(...) failed\n...
    copy_iovs(224)...: process_vm_readv failed (errno 3)`` -> ``Other MPI error:
    process_vm_readv failed (errno 3)``.
    """
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    if not lines:
        return type(error).__name__
    head = lines[0].removesuffix(", error stack:")
    causes = [ln.split(": ", 1)[1].strip() for ln in lines[1:] if ": " in ln]
    causes = [c for c in causes if c]
    return f"{head}: {causes[-1]}" if causes else head


class StallClock:
    """When a wait that began at ``start`` is due for its next stall report, every
    ``timeout`` s, not counting time this process itself did not run.

    A rank stopped by SIGSTOP (a debugger, a job suspended by the batch system) or frozen with
    its machine wakes up with its wait long past the timeout, although its peers kept going:
    a report then would blame them for the rank's own stop. A sleep that ends more than
    ``SUSPENDED`` s (or a quarter of the timeout, if longer) later than asked is such a gap: it
    is logged once as what it is and moves the report on by its length.
    """

    def __init__(
        self,
        timeout: float,
        log: logging.Logger,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.timeout, self.log, self.clock, self._sleep = timeout, log, clock, sleep
        self.start = clock() if start is None else start
        self.next = self.start + timeout
        self.suspended = 0.0  # seconds of the wait this process did not run
        self.gap_limit = max(SUSPENDED, timeout / 4)
        # the end of the last sleep: a stop may land between two sleeps (in a test of the
        # requests), so a gap is measured from there, not from the sleep's own start
        self.last = self.start

    def sleep(self, seconds: float, what: Callable[[], str] | str = "") -> None:
        """Sleep (or wait: ``sleep`` may be a condition's ``wait``) and account for a gap."""
        self._sleep(seconds)
        self.slept(self.last, seconds, what)

    def slept(self, before: float, seconds: float, what: Callable[[], str] | str = "") -> None:
        """A sleep of ``seconds`` has returned; ``before``: when the previous one ended (or the
        wait began), so that the tests between two sleeps count as well."""
        now = self.clock()
        self.last = now
        gap = now - before - seconds
        if gap > self.gap_limit:
            self.suspended += gap
            self.next += gap
            text = what() if callable(what) else what
            self.log.warning(
                "this rank did not run for %.1f s (stopped, e.g. by SIGSTOP, or its machine "
                "frozen) while waiting for %s: not a stall of its peers", gap, text,
            )  # fmt: skip

    def due(self, now: float | None = None) -> bool:
        """True once per ``timeout`` s of the wait in which this process ran."""
        now = self.clock() if now is None else now
        if now < self.next:
            return False
        self.next = now + self.timeout
        return True

    def stalled(self, now: float | None = None) -> float:
        """Seconds waited so far, less the time this process did not run."""
        return (self.clock() if now is None else now) - self.start - self.suspended


class Waiter:
    """Back-off waits on MPI requests or conditions, with a stall report."""

    def __init__(
        self,
        log: logging.Logger,
        peers: PeerLog,
        poll_min: float = 1e-5,
        poll_max: float = 1e-3,
        stall_timeout: float = 60.0,
        spin: int | None = None,
        long_max: float | None = None,
    ) -> None:
        self.log, self.peers = log, peers
        self.poll_min, self.poll_max, self.stall_timeout = poll_min, poll_max, stall_timeout
        self.spin = spin  # tests before the first sleep (Backoff; None: its default)
        # the ceiling of a wait idle LONG_WAIT s (Backoff's ``long``): by default long_poll_max
        # of a node with a rank per core, i.e. LONG_POLL
        self.long_max = max(long_poll_max(poll_max, 1, 1) if long_max is None else long_max,
                            poll_max)  # fmt: skip
        self.waited = 0.0  # total seconds spent in waits, for the statistics
        # when peers are next checked for a death: per waiter, not per wait, so a rank whose
        # waits are each shorter than the period (a statistics server hearing from the other
        # learners) still notices a dead one within about a period of its sleeping
        self.next_check = 0.0

    def check_peers(self, what: Callable[[], str] | str, now: float) -> None:
        """Raise :class:`PeerLost` if a peer has died (looked at once per LIVENESS_PERIOD): a
        peer that died while no transfer with it was under way raises no MPI error, and a
        wait on it would never end."""
        if now < self.next_check:
            return
        self.next_check = now + LIVENESS_PERIOD
        if self.peers.dead():
            raise self.peers.lost(what() if callable(what) else what)

    def report_stall(self, seconds: float, what: Callable[[], str] | str) -> None:
        """The stall report of every wait: for how long, what for, what came last from whom."""
        text = what() if callable(what) else what
        self.log.warning(
            "stalled %.0f s waiting for %s; last received: %s", seconds, text, self.peers.report()
        )

    def until(
        self,
        done: Callable[[], bool],
        what: Callable[[], str] | str,
        tight: float = 0.0,
        rung_by: Collection[int] = (),
        quiet: Callable[[], bool] | None = None,
    ) -> None:
        """Return once ``done()`` is true; sleep between checks so an idle rank stays idle
        (``tight``: seconds of shortest sleeps first, see :class:`Backoff`).

        ``rung_by``: the ranks that ring this rank's doorbell once they sent what ``done``
        waits for. Where all of them share a doorbell with this rank
        (:mod:`pserver.comm.doorbell`), each sleep is one sleep on the doorbell up to the
        back-off's ceiling instead of the back-off's ramp of short sleeps: a ring ends it at
        once, and without a ring the wait tests as often as an idle wait already did.
        ``quiet``: whether this rank has nothing of its own in flight that needs its tests to
        move (a send); while it is false the wait backs off as without a doorbell.
        """
        bells = self.peers.bells
        if bells is None or not rung_by or not bells.covers(rung_by):
            bells = None
        if self._test(done, what):
            return
        tighten_timer_slack()
        backoff = Backoff(self.poll_min, self.poll_max, tight, self.spin, self.long_max)
        start = backoff.since
        stall = StallClock(self.stall_timeout, self.log, start)
        try:
            while True:
                seen = bells.seen() if bells is not None else 0  # before the test: a ring
                if self._test(done, what):  # between the test and the sleep is not missed
                    break
                pause = backoff.next_sleep()
                if not pause:
                    continue
                if bells is not None and (quiet is None or quiet()):
                    pause = backoff.ceiling()
                    bells.wait(seen, pause)
                    stall.slept(stall.last, pause, what)
                else:
                    stall.sleep(pause, what)
                now = time.monotonic()
                self.check_peers(what, now)
                if stall.due(now):
                    self.report_stall(stall.stalled(now), what)
            # a stop that landed in the test that found the wait over is a gap too: say so
            stall.slept(stall.last, 0.0, what)
        finally:
            self.waited += time.monotonic() - start

    def _test(self, done: Callable[[], bool], what: Callable[[], str] | str) -> bool:
        """``done()``, with an MPI failure turned into :class:`PeerLost` naming the peer."""
        for _ in range(ABSORB_RETRIES):
            try:
                return done()
            except MPI.Exception as e:
                # a lost learner (ULFM): acknowledged, its requests ended in error: test again
                if not self.peers.absorb(e, self.log):
                    raise self.peers.lost(what() if callable(what) else what, e) from e
                error = e
        raise self.peers.lost(what() if callable(what) else what, error) from error

    def wait(
        self, request: MPI.Request, what: Callable[[], str] | str, rung_by: Collection[int] = ()
    ) -> MPI.Status:
        status = MPI.Status()
        self.until(lambda: request.Test(status), what, rung_by=rung_by)
        return status

    def waitall(
        self,
        requests: Sequence[MPI.Request],
        what: Callable[[], str] | str,
        rung_by: Collection[int] = (),
    ) -> None:
        if requests:
            self.until(lambda: MPI.Request.Testall(list(requests)), what, rung_by=rung_by)

    def probe(
        self,
        comm: MPI.Comm,
        what: Callable[[], str] | str,
        also: Callable[[], bool] = lambda: False,
        rung_by: Collection[int] = (),
    ) -> tuple[MPI.Message | None, MPI.Status]:
        """Wait until a message from anyone is pending on ``comm``; match it and return it.

        A matched probe (``MPI_Improbe``), never a posted wildcard receive: across hosts,
        MPICH's default UCX netmod loses posted ``ANY_SOURCE`` receives (docs/architecture.md,
        "Wildcard receives"). The message is out of MPI's matching from here on: the caller must
        receive it through the returned ``Message`` (``Recv``/``Irecv``, or ``recv`` when it
        was pickled), and the status says who sent it with which tag. None (no message) when
        ``also()`` turned true first.
        """
        status = MPI.Status()
        found: list[MPI.Message] = []

        def matched() -> bool:
            # lowercase improbe: its Message also knows a pickled message's size for ``recv``
            msg = comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if msg is not None:
                found.append(msg)
            return msg is not None or also()

        self.until(matched, what, rung_by=rung_by)
        return (found[0] if found else None), status
