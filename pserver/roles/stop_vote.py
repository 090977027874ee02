"""The learners' agreement on where a signal stops them: one boundary, the same on all.

A lockstep strategy's learners (SYNC and HYBRID step by step, BMUF and MA block by block) must
stop at the same boundary: a learner that stops one step early leaves the others in an
allreduce, or in a block round, that never completes, and a checkpoint of learners at different
steps is no consistent cut. A signal reaches the ranks at different moments, so each learner
votes and all act on the vote's result, never on their own flag (``pserver.runtime.signals.STOP``).

The vote is lagged by one boundary, so that it seldom makes a learner wait: at boundary ``k``
a learner first takes the result of the vote posted at boundary ``k − 1`` (a non-blocking
``MAX`` reduction of every learner's flag, on a communicator of its own), stops if any
learner had seen a signal then, and otherwise posts its vote for boundary ``k + 1``. Every
learner therefore stops at the same boundary, one boundary after the first learner saw the
signal (one step of SYNC/HYBRID, one block of τ local steps of BMUF/MA).

Liveness: the learners pass the same boundaries in the same order (lockstep: the same steps,
or the same blocks), and every decision is taken from a reduction's result, the same on all,
so each learner posts exactly the same sequence of votes and each vote completes once every
learner has posted it. A learner reaching boundary k knows that every other learner has
left boundary k − 2 at least, and so is at most one step (a block) away from posting vote
k − 1, which needs nothing of this learner: SYNC's allreduce of step k − 1 completed only once
every learner started it, after posting vote k − 1; HYBRID's allreduce of step k − 2 and
BMUF's round of block k − 2, which a learner needed to get here, were started or pushed by
every learner just before it posted vote k − 1. So the wait at the next boundary normally
finds the vote complete, and otherwise lasts until the slowest learner's next boundary. A vote
posted at the last boundary (BMUF's shards end the run in the pull that follows it) is
completed by :meth:`StopVote.finish`, which every learner reaches at the end of its loop.
Waits use the Waiter's back-off and stall report (no blocking MPI call, no spinning); the
communicator is duplicated with ``Idup``, waited the same way at the first vote.

A periodic checkpoint (``run.checkpoint_interval``, ``pserver.ckpt.drivers.periodic``) pauses
the learners through the same vote: a learner whose pause is due votes :data:`PAUSE`, one that
saw a signal :data:`SIGNAL` (the larger: a signal ends the run even when a pause was due too),
and every learner acts on the maximum (:attr:`StopVote.decided`), so all pause at one boundary.

A lost learner (Open MPI's ULFM, issue 22) never posts its votes: the first survivor whose vote
fails revokes the vote's communicator, so every survivor's pending or next vote fails too, and
each turns the vote off (:meth:`StopVote.abandon`) for the rest of the run: after a loss the
end checkpoint is not committed anyway (``pserver.ckpt.drivers.end``), and a signal then ends
the rank as in a run that cannot be checkpointed. (A signal that lands in the very vote a
learner dies in may stop the survivors whose vote completed and not the others; those stop
at the signal's own delivery.)
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from pserver.comm.collectives import CollectiveLost, FailFastWaiter
from pserver.comm.waiting import Waiter
from pserver.runtime.signals import STOP

if TYPE_CHECKING:
    from pserver.plan.config import Config

#: a learner's vote (the reduction keeps the largest)
GO, PAUSE, SIGNAL = 0, 1, 2


class StopVote:
    """One learner's side of the lagged vote (see the module docstring). ``pause_wanted`` is
    set by the learner's loop before each boundary (a periodic checkpoint is due);
    ``decided`` is what stopped the learners (:data:`PAUSE` or :data:`SIGNAL`)."""

    def __init__(self, comm: MPI.Comm, waiter: Waiter) -> None:
        self.comm, self.dup_req = comm.Idup()  # collective: every learner builds its exchange
        self.waiter = FailFastWaiter(waiter)  # a lost learner: CollectiveLost, not a false vote
        self.off = False  # a learner was lost: no more votes (abandon)
        self.flag = np.zeros(1, np.int32)  # not touched while a vote reads it
        self.result = np.zeros(1, np.int32)
        self.pending: MPI.Request | None = None
        self.votes = 0  # votes posted (for the stall report)
        self.pause_wanted = False
        self.decided = GO

    def boundary(self, another: bool) -> bool:
        """At a boundary every learner passes: whether to stop here (the same on every
        learner). ``another``: whether a boundary follows this one (False at a run's known
        last boundary: no vote is posted that nobody would read)."""
        try:
            return self._boundary(another)
        except CollectiveLost:
            self.abandon()
            return False

    def _boundary(self, another: bool) -> bool:
        if self.off:
            return False
        if self.pending is not None:
            self.waiter.wait(self.pending, self.what())
            self.pending = None
            if self.result[0]:
                self.decided = int(self.result[0])
                return True
        if another:
            self.post()
        return False

    @property
    def paused(self) -> bool:
        """The learners stopped to pause (a periodic checkpoint), not for a signal."""
        return self.decided == PAUSE

    def post(self) -> None:
        if self.dup_req is not None:
            self.waiter.wait(self.dup_req, "the learners' communicator for the stop vote")
            self.dup_req = None
        self.flag[0] = SIGNAL if STOP.requested else PAUSE if self.pause_wanted else GO
        self.pending = self.waiter.post(
            lambda: self.comm.Iallreduce(self.flag, self.result, op=MPI.MAX)
        )
        self.votes += 1

    def what(self) -> str:
        return f"the learners' stop vote {self.votes} (every learner posts it at a boundary)"

    def finish(self) -> None:
        """At the end of a learner's loop: complete a vote posted at the last boundary (and
        the communicator's duplication, which every learner posted when it was built)."""
        try:
            self._finish()
        except CollectiveLost:
            self.abandon()

    def abandon(self) -> None:
        """A learner was lost (ULFM): revoke the vote's communicator, so that every survivor's
        vote fails as this one's did, and vote no more (see the module docstring)."""
        if not self.off:
            self.waiter.log.warning(
                "the learners' stop vote is off after the loss of a learner: a signal now "
                "ends the run without an end checkpoint"
            )
        self.off, self.pending, self.dup_req = True, None, None
        with contextlib.suppress(MPI.Exception):
            self.comm.Revoke()

    def _finish(self) -> None:
        if self.off:
            return
        if self.pending is not None:
            self.waiter.wait(self.pending, self.what())
            self.pending = None
        if self.dup_req is not None:
            self.waiter.wait(self.dup_req, "the learners' communicator for the stop vote")
            self.dup_req = None

    def close(self) -> None:
        """Free the communicator; also called after an error, so it never waits: with a
        vote or the duplication still pending (a learner failed mid-run, the job is being
        aborted) the communicator is left to the end of the process."""
        if self.off:
            return  # revoked after a loss: left to the end of the process
        if self.dup_req is None and self.pending is None and self.comm != MPI.COMM_NULL:
            self.comm.Free()


def stop_vote(cfg: Config, learners: MPI.Comm | None, waiter: Waiter) -> StopVote | None:
    """A vote among the learners (``learners``: their communicator) when this run (``cfg``)
    can be checkpointed (the same answer on every learner: a function of the config), else
    None (a signal then ends the rank)."""
    from pserver.ckpt.resume import unsupported

    if unsupported(cfg) is not None or learners is None:
        return None
    return StopVote(learners, waiter)
