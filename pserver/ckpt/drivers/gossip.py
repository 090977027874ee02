"""ADPSGD's checkpoint on the learners: the cut, the state saved and restored (the pure half,
names and checks: ``pserver.ckpt.records.gossip``).

The cut. A learner stops at a step boundary (the data server's stop, or a signal that the
trainer saw, ``pserver.runtime.signals``), where its last update is applied and, a sender, its last
exchange started. It then says goodbye as at the end of any run (``pserver.roles.gossip``,
``Gossip.finish``): a sender waits for the answer to its last exchange and sends a goodbye
to each neighbour; a receiver keeps answering until every neighbour has said goodbye. So no
pairwise exchange is pending refused or half done: each one started is completed on both
sides, and both hold the same average. The epoch averages are then cut where every learner
agrees (:class:`CutAgreement`, ``pserver.roles.gossip_model``), and each learner's model,
update rule state, vector clock, exchange index and epoch count are those of the same
moment: no message of the gossip is on its way when it saves.

Liveness. A learner that is still training waits only for its receiver's answer (a receiver
answers in its communication thread while it computes, and in ``finish`` until its goodbyes)
or for a minibatch (the data server serves until every learner said goodbye, then stops at
the run's M minibatches), so every learner reaches ``finish``, whether or not it saw the
signal; the goodbyes end by ``pserver.protocols.ring``'s termination argument; the agreement is one
allreduce that every learner posts exactly once, after its goodbyes, on a communicator used
for nothing else, so it completes once the last learner has posted it; the averages then
follow the same sequence on every learner. Every wait goes through the Waiter's back-off
with a stall report naming what it waits for; none spins.

Restore. The exchange's engine is started only after the saved model and clock are in place
(``Gossip(start=False)``), so no neighbour's request can be averaged into the model before it
is restored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np
from mpi4py import MPI

from pserver.ckpt.files import State
from pserver.ckpt.records.gossip import GossipRecord, agreed_cut
from pserver.comm.waiting import Waiter

if TYPE_CHECKING:
    from pserver.comm.backend import Backend
    from pserver.optim.local_update import LocalUpdate
    from pserver.roles.gossip import Gossip
    from pserver.roles.gossip_model import GossipModel


class GossipOwner(Protocol):
    """What a gossip learner's record reads and writes of its exchange (``GossipExchange``
    is one): the gossip state (model, clocks, counters), the backend, the update rule, the
    epoch counter of the averages and the clock it reports (``have[0]``)."""

    @property
    def gossip(self) -> Gossip: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def rule(self) -> LocalUpdate: ...
    @property
    def average(self) -> GossipModel: ...
    @property
    def have(self) -> dict[int, int]: ...


class CutAgreement:
    """The learners' one agreement at the end of a run: was any stopped, up to which epoch
    did any join the averages (see the module). Builds its communicator at once: every
    learner must construct it at the same point (collective)."""

    def __init__(self, comm: MPI.Comm, waiter: Waiter) -> None:
        self.comm, self.waiter = comm.Dup(), waiter

    def agree(self, stopped: bool, owed: int) -> tuple[bool, int]:
        buf = np.array([int(stopped), owed], dtype=np.int64)
        req = self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        self.waiter.waitall([req], "the other learners to end their run (the checkpoint's cut)")
        return agreed_cut((int(buf[0]), int(buf[1])))

    def agree_until(
        self, stopped: bool, owed: int, until: Callable[[Callable[[], bool], str], bool]
    ) -> tuple[bool, int] | None:
        """:meth:`agree`, waiting with ``until(done, what)``, which returns False when the
        learners' ring broke (a lost learner, ``pserver.roles.gossip``): then None."""
        buf = np.array([int(stopped), owed], dtype=np.int64)
        req = self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        if not until(req.Test, "the other learners to end their run (the checkpoint's cut)"):
            return None
        return agreed_cut((int(buf[0]), int(buf[1])))

    def free(self) -> None:
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


def exchange_state(ex: GossipOwner) -> State:
    """A :class:`~pserver.roles.gossip_exchange.GossipExchange`'s state after ``finish``."""
    g, to_host = ex.gossip, ex.backend.to_host
    with g.lock:
        opt = {name: to_host(a) for name, a in ex.rule.updater.state_arrays().items()}
        record = GossipRecord(
            to_host(g.w), opt, tuple(int(s) for s in g.clock.steps), int(g.k),
            int(g.exchanged), int(ex.average.counter.next_epoch),
        )  # fmt: skip
    return record.to_state()


def restore_exchange(ex: GossipOwner, state: State) -> None:
    """Put the saved state into a freshly built exchange whose engine is not started yet."""
    g, copy_in = ex.gossip, ex.backend.copy_from_host
    arrays = ex.rule.updater.state_arrays()
    r = GossipRecord.from_state(state, list(arrays))
    copy_in(r.w, g.w)
    for name, a in arrays.items():
        copy_in(r.opt[name], a)
    g.clock.steps = list(r.clock)
    g.k, g.exchanged = r.k, r.exchanged
    ex.have[0] = g.clock.own
    ex.average.resumed(r.next_epoch)
