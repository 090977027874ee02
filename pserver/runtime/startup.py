"""The start-up agreement: every rank learns whether any rank failed to prepare.

Any exception raised while a rank prepares (bad input as a ``PserverError``, but also a
``MemoryError`` on a smaller node, an ``OSError`` of a flaky file system, an h5py error) becomes
a status; the ranks exchange their statuses with a non-blocking ``Iallgather`` of one int32
each, waited on with the :class:`~pserver.comm.waiting.Waiter`'s back-off, and then either all
train or all stop. The first failing rank prints its one line; every rank exits with the same
status (2 for bad input, 1 for anything else).

Liveness: every rank reaches the agreement, because ``prepare`` ends by returning or raising
and both lead here (nothing in it is collective, so no rank waits on another inside it). A rank
stuck inside ``prepare`` (a hung file system) leaves the others in the agreement's wait, which
sleeps (no core spun), reports the stall every ``comm.stall_timeout`` seconds, and ends with
:class:`~pserver.errors.PeerLost` if a rank of this node dies meanwhile.
"""

from __future__ import annotations

import socket
import traceback
from pathlib import Path

import numpy as np
from mpi4py import MPI

from pserver.comm.waiting import Waiter
from pserver.errors import PserverError

OK, BAD_INPUT, FAILED = 0, 1, 2  # what a rank reports to the agreement
EXIT = {BAD_INPUT: 2, FAILED: 1}  # the exit status of every rank, by the first failure


def status_of(error: BaseException | None) -> int:
    if error is None:
        return OK
    return BAD_INPUT if isinstance(error, PserverError) else FAILED


def failure_message(error: BaseException, rank: int, size: int) -> str:
    """The line a failing rank prints (without the ``pserver-run: error:`` prefix).

    Bad input says what is wrong and how to fix it; anything else names the rank, the host,
    the exception and where it was raised, since it is a fault of this node or of pserver.
    """
    if isinstance(error, PserverError):
        return str(error)
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    frames = traceback.extract_tb(error.__traceback__)
    at = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return (
        f"rank {rank} of {size} on {socket.gethostname()} failed while preparing the run: "
        f"{text}{at}"
    )


#: what the start-up agreement waits for (its stall report and a lost rank's message say it)
PREPARING = (
    "every rank to finish preparing (config, dataset, model, output directory); a rank that "
    "never arrives is stuck in its preparation"
)
#: what the agreement at the end of a run waits for
ENDING = (
    "every rank to end the run (training over, its end checkpoint written); a rank that never "
    "arrives is still training or stuck in its end"
)


def agree(comm: MPI.Comm, status: int, waiter: Waiter, what: str = PREPARING) -> np.ndarray:
    """Every rank's status, gathered without blocking in MPI (collective over ``comm``)."""
    mine = np.array([status], dtype=np.int32)
    every = np.empty(comm.Get_size(), dtype=np.int32)
    request = comm.Iallgather(mine, every)
    waiter.wait(request, what)
    return every


def agree_alive(
    comm: MPI.Comm, status: int, waiter: Waiter, ulfm: bool
) -> tuple[np.ndarray, list[int]]:
    """:func:`agree` among the ranks still alive: (every rank's status, 0 for a dead one;
    the dead ranks). ``ulfm``: the run survives lost learners (``pserver.comm.departures``);
    then every rank shrinks ``comm`` first (``MPI_Comm_shrink``, which agrees who failed; a
    plain copy when nobody did), whether or not it saw a loss itself, so all call the same
    collectives. The blocking shrink, once at the end of a run: Open MPI 5.0's
    ``MPI_Comm_ishrink`` fails with ``MPI_ERR_INTERN`` once a rank has died (measured on
    5.0.11), and the survivors reach this point together (their loops have ended)."""
    if not ulfm:
        return agree(comm, status, waiter, ENDING), []
    alive = comm.Shrink()
    try:
        got = agree(alive, status, waiter, ENDING)
        ranks = MPI.Group.Translate_ranks(
            alive.Get_group(), list(range(alive.Get_size())), comm.Get_group()
        )
    finally:
        alive.Free()
    every = np.zeros(comm.Get_size(), dtype=np.int32)
    every[list(ranks)] = got
    return every, sorted(set(range(comm.Get_size())) - set(ranks))


def outcome(statuses: np.ndarray, rank: int) -> tuple[int, bool, str]:
    """(exit status, whether this rank prints its message, the suffix to add to it).

    The lowest failing rank prints; when bad input was found by some ranks only, its line
    says which rank (a message of any other failure names it already).
    """
    failed = np.flatnonzero(statuses != OK)
    if len(failed) == 0:
        return 0, False, ""
    first = int(failed[0])
    status = int(statuses[first])
    some = len(failed) < len(statuses) and status == BAD_INPUT
    suffix = f" (on rank {first} of {len(statuses)})" if some else ""
    return EXIT[status], rank == first, suffix
