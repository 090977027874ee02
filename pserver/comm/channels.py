"""One duplicated communicator per traffic class, built once at start-up.

Requests travelling up (pushes, pulls, goodbyes) use ``ctrl`` and are matched with ANY_TAG in
arrival order, so a learner's push is always processed before its next pull (MPI's
non-overtaking rule). Replies travelling down use ``down``, tagged by block, so an aggregator can
listen to its children with a wildcard and to its parent at once. Array payloads use ``bulk``,
the data server ``io``, the statistics server ``stats``, and ``ack`` a learner's word that it
copied weights out of a shared window (``comm/shm.py``); keeping them apart means no wildcard
receive can ever match the wrong traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI


@dataclass
class Channels:
    world: MPI.Comm
    ctrl: MPI.Comm
    down: MPI.Comm
    bulk: MPI.Comm
    io: MPI.Comm
    stats: MPI.Comm
    ack: MPI.Comm

    @classmethod
    def create(cls, comm: MPI.Comm) -> Channels:
        """Collective over ``comm``: every rank must call it."""
        return cls(comm, *(comm.Dup() for _ in range(6)))

    def free(self) -> None:
        for c in (self.ctrl, self.down, self.bulk, self.io, self.stats, self.ack):
            c.Free()
