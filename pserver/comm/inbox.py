"""Headers arriving from anyone on one communicator, waited for without burning a core.

Wildcard receives go through matched probes (``MPI_Improbe`` then ``MPI_Imrecv``), never a posted
``MPI_Irecv(MPI_ANY_SOURCE)``: across hosts, MPICH's default UCX netmod (the PyPI wheel's) loses
or never completes posted wildcard receives, and every multi-host run stalled; a matched probe
asks for a message that has already arrived and binds it to this rank at once, so the receive
that follows is one from a known source (docs/architecture.md, "Wildcard receives").
"""

from __future__ import annotations

from collections.abc import Callable

from mpi4py import MPI

from pserver.comm.waiting import PeerLog, Waiter
from pserver.comm.wire import Header, header_buffer


class Inbox:
    """The next header from anyone, taken by a matched probe.

    Nothing is posted between calls: a wait that ends for another reason (``also``, ``due``)
    leaves no request behind, and a probed message is always received before ``next`` returns
    (a matched message is out of MPI's matching and would otherwise be lost).
    """

    def __init__(self, comm: MPI.Comm, waiter: Waiter, peers: PeerLog) -> None:
        self.comm, self.waiter, self.peers = comm, waiter, peers
        self.buf = header_buffer()
        self.closed = False

    def next(
        self,
        what: Callable[[], str] | str,
        also: Callable[[], bool] = lambda: False,
        due: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> Header | None:
        """The next header; None if ``also()`` turned true or ``clock()`` reached ``due`` first.

        Liveness: each check probes once and calls ``also`` once, so the wait ends as soon as a
        header is pending, ``also`` holds or ``due`` passed; the probed header is then received
        from its now-known source, which MPI completes because the message is already matched.
        """
        if self.closed:
            raise RuntimeError("Inbox.next after close")
        msg: MPI.Message | None = None

        def done() -> bool:
            nonlocal msg
            msg = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            other = also()  # always polled: a busy inbox must not starve the other source
            expired = due is not None and clock is not None and clock() >= due
            return msg is not None or other or expired

        self.waiter.until(done, what)
        if msg is None:
            return None
        self.waiter.wait(msg.Irecv(self.buf), "a probed header")
        header = Header.unpack(self.buf[0])
        self.peers.note(header.sender, header)
        return header

    def close(self) -> None:
        """Stop taking headers (everyone who could send has said goodbye).

        Nothing is posted between calls to ``next``, so there is no receive to withdraw.
        """
        self.closed = True
