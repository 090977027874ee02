"""Headers arriving from anyone on one communicator, waited for without burning a core."""

from __future__ import annotations

from collections.abc import Callable

from mpi4py import MPI

from pserver.comm.waiting import PeerLog, Waiter
from pserver.wire import Header, header_buffer


class Inbox:
    """One posted wildcard receive at a time; it survives a wait that ends for another reason."""

    def __init__(self, comm: MPI.Comm, waiter: Waiter, peers: PeerLog) -> None:
        self.comm, self.waiter, self.peers = comm, waiter, peers
        self.buf = header_buffer()
        self.req: MPI.Request | None = None

    def next(
        self,
        what: Callable[[], str] | str,
        also: Callable[[], bool] = lambda: False,
        due: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> Header | None:
        """The next header; None if ``also()`` turned true or ``clock()`` reached ``due`` first."""
        if self.req is None:
            self.req = self.comm.Irecv(self.buf, MPI.ANY_SOURCE, MPI.ANY_TAG)
        req, arrived = self.req, False

        def done() -> bool:
            nonlocal arrived
            arrived = req.Test()
            other = also()  # always polled: a busy inbox must not starve the other source
            expired = due is not None and clock is not None and clock() >= due
            return arrived or other or expired

        self.waiter.until(done, what)
        if not arrived:
            return None
        self.req = None
        header = Header.unpack(self.buf[0])
        self.peers.note(header.sender, header)
        return header

    def close(self) -> None:
        """Withdraw the posted receive (everyone who could send has said goodbye)."""
        if self.req is not None:
            self.req.Cancel()
            self.req.Wait()
            self.req = None
