"""Lost learners under Open MPI's ULFM: a learner's death becomes a departure, not an abort.

Open MPI started with ``mpiexec --with-ft ulfm`` (which sets ``OMPI_MCA_mpi_ft_enable=1`` in
every rank's environment) and its heartbeat detector (``--mca mpi_ft_detector true``) reports a
dead rank to every survivor within the detector's timeout: a wildcard receive or probe then
fails with ``MPI_ERR_PROC_FAILED`` until the failure is acknowledged on that communicator
(``MPI_Comm_ack_failed``), and a request to or from the dead rank completes in error. Without
ULFM (MPICH's wheel, Open MPI without ``--with-ft``) nothing here is switched on and a lost
rank ends the job as before (:meth:`pserver.comm.waiting.PeerLog.lost`).

:class:`Departures` is one per rank. A wait that gets such an error asks it to *absorb* the
failure: it reads the failed processes (``MPI_Comm_get_failed``), acknowledges them on every
communicator the rank takes wildcard messages on, and keeps each newly lost rank with the time
it was seen. A failed rank that is not a learner (a shard, the statistics or data server, an
aggregator) cannot be absorbed: the wait then ends the job naming it, as without ULFM. The
drivers read :meth:`Departures.lost` in their loops and treat each lost learner like one that
said goodbye (the protocols' ``lose``), so no communicator is revoked in the parameter-server
family: the survivors simply stop expecting the dead learner. Only the agreement at the end of
the run is collective, and it runs on the world shrunk to the survivors
(``pserver.runtime.startup.agree_alive``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

if TYPE_CHECKING:
    from pserver.comm.channels import Channels
    from pserver.plan.config import Config

FT_ENV = "OMPI_MCA_mpi_ft_enable"  # set by Open MPI's mpiexec --with-ft ulfm
#: MPI error classes that say a peer failed (the wait may absorb them).
FAILURE_CLASSES = frozenset(
    getattr(MPI, name)
    for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_IN_STATUS")
    if hasattr(MPI, name)
)


def ulfm_enabled(library: str | None = None, env: dict[str, str] | None = None) -> bool:
    """Whether this MPI library runs with ULFM on: Open MPI, launched with ``--with-ft ulfm``."""
    library = MPI.Get_library_version() if library is None else library
    env = os.environ if env is None else env  # type: ignore[assignment]
    on = str(env.get(FT_ENV, "")).strip().lower() in ("1", "true", "yes", "enabled")
    return library.startswith("Open MPI") and on


class Departures:
    """The learners this rank has lost, and the failures it acknowledged.

    ``world``: the communicator whose ranks the job's layout numbers; ``learners``: the ranks
    whose loss the run survives (a strategy that cannot absorb a loss passes none);
    ``comms``: communicators taking wildcard messages, on which a failure is acknowledged.
    """

    def __init__(
        self,
        world: MPI.Comm,
        learners: Iterable[int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world = world
        self.learners = frozenset(learners)
        self.comms: list[MPI.Comm] = [world]
        self.clock = clock
        self._lock = threading.Lock()
        self._lost: dict[int, float] = {}  # rank -> when this rank saw it gone (clock())

    def watch(self, *comms: MPI.Comm) -> None:
        """Acknowledge failures on these communicators too (the traffic channels)."""
        self.comms.extend(comms)

    def failed(self) -> list[int]:
        """The ranks of ``world`` MPI knows to have failed (local knowledge)."""
        group = self.world.Get_failed()
        try:
            n = group.Get_size()
            if n == 0:
                return []
            ranks = MPI.Group.Translate_ranks(group, list(range(n)), self.world.Get_group())
        finally:
            group.Free()
        return sorted(int(r) for r in ranks if r != MPI.UNDEFINED)

    def absorb(self) -> tuple[list[int], list[int]]:
        """Read and acknowledge the failures MPI knows of: (newly lost learners, failed ranks
        that are not learners). Only the first may go on; the second end the job."""
        failed = self.failed()
        fatal = [r for r in failed if r not in self.learners]
        with self._lock:
            new = [r for r in failed if r in self.learners and r not in self._lost]
            now = self.clock()
            for r in new:
                self._lost[r] = now
        if not fatal:
            for comm in self.comms:
                comm.Ack_failed()  # wildcard receives on it work again
        return new, fatal

    def lost(self) -> dict[int, float]:
        """Every learner lost so far (rank -> when it was seen gone)."""
        with self._lock:
            return dict(self._lost)

    def is_lost(self, rank: int) -> bool:
        with self._lock:
            return rank in self._lost


class Heartbeat:
    """A thread that lets MPI progress every ``period`` seconds, so that Open MPI's failure
    detector hears this rank while it computes, imports or writes without calling MPI.

    The detector's heartbeats go out only from inside MPI calls unless its own thread is on
    (``--mca mpi_ft_detector_thread true``), and that thread makes ``MPI_Finalize`` hang once
    a rank has died (Open MPI 5.0.11, measured). Without either, a rank busy for longer than
    ``mpi_ft_detector_timeout`` (start-up imports on a loaded node, a long compute) is
    declared dead by its observer and aborts itself. A probe for a message from this rank to
    itself on a tag nobody sends runs the progress engine and can never fail.
    """

    TAG = 32767  # the MPI standard's smallest MPI_TAG_UB: valid everywhere, sent by nobody

    def __init__(self, comm: MPI.Comm, period: float = 0.1) -> None:
        self.comm, self.period = comm, period
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="mpi-heartbeat", daemon=True)

    def run(self) -> None:
        me = self.comm.Get_rank()
        while not self.stopped.wait(self.period):  # ends at once when stop() sets it
            self.comm.Iprobe(me, self.TAG)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop, and finalize MPI at once: Python's own exit may take longer than the
        detector's timeout, and a silent rank is declared dead."""
        self.stopped.set()
        self.thread.join()
        finalize()


def heartbeat(comm: MPI.Comm) -> contextlib.AbstractContextManager[Any]:
    """A :class:`Heartbeat` for the rank's life where ULFM is on (and MPI allows threads);
    else nothing."""
    if not ulfm_enabled() or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return contextlib.nullcontext()
    return Heartbeat(comm)


FINALIZE_GRACE = 20  # s (signal.alarm takes whole seconds)


def finalize() -> None:
    """``MPI_Finalize`` under ULFM, bounded: after a rank died, Open MPI 5.0.11's finalize
    sometimes never returns on the survivors (seen in tests: every survivor sleeping in
    ``ompi_mpi_finalize``'s wait for the job-wide fence for minutes). The run is over and its
    files are closed by then, so after ``FINALIZE_GRACE`` seconds SIGALRM's default action
    ends the rank (mpi4py's ``Finalize`` holds the GIL: no Python thread could); the dump's
    ``finished`` attribute says the run finished (docs/launching.md, *Lost learners*)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(FINALIZE_GRACE)
    MPI.Finalize()
    signal.alarm(0)


def departures_for(
    world: MPI.Comm, comms: Iterable[MPI.Comm], learners: Iterable[int], survives: bool
) -> Departures | None:
    """The rank's :class:`Departures` when the run survives lost ``learners`` (its strategy
    can, ``survives``, and the library offers ULFM); None: a lost rank ends the job."""
    if not survives or not ulfm_enabled():
        return None
    d = Departures(world, learners)
    d.watch(*comms)
    return d


def departures_of(
    world: MPI.Comm, ch: Channels, learners: Iterable[int], cfg: Config
) -> Departures | None:
    """:func:`departures_for` of a prepared rank, its channels ``ch`` built (before the start
    barrier, ``pserver.job.cli.run``)."""
    from pserver.strategies import survives_lost_learner

    comms = (ch.ctrl, ch.down, ch.bulk, ch.io, ch.stats, ch.ack)
    return departures_for(world, comms, learners, survives_lost_learner(cfg))


def is_failure(error: BaseException) -> bool:
    """Whether an MPI exception may say that a peer failed (ULFM's error classes)."""
    if not isinstance(error, MPI.Exception):
        return False
    return error.Get_error_class() in FAILURE_CLASSES
