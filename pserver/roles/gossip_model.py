"""ADPSGD's average model for the statistics server: an epoch's test and the final model.

IBM tests the learners' average model. ADPSGD's learners run free (each at its own pace, the
data server handing out the run's M minibatches in request order), so no step index ends an
epoch on every learner at once. Each learner counts its **own** epochs: its step ``k`` is taken
to complete ``(k + 1)·λ`` minibatches of the run, as it would were every learner at its pace
(the same count its learning-rate schedule uses), and the shards' ``EpochCounter`` turns that
count into the epochs ended and tested. For each tested epoch ``e`` before the last, every
learner joins the ``e``-th non-blocking allreduce of its model (the sum, divided by λ: the
average), with its model at the step that ended ``e`` for it — or, if its previous average is
still in flight, at the step it is posted; a learner that stops before it reaches ``e`` (it got
fewer minibatches: a straggler) joins with its final model. The last epoch's average is the
final model: it is taken once every learner has finished training **and** gossiping
(after :meth:`pserver.roles.gossip.Gossip.finish`), so it is the exact mean of the models. Learner
0 sends the averages (:class:`pserver.roles.model_report.ModelReport`).

Liveness: the allreduces are posted in the same order (epoch 1, 2, …, then the final one) on
every learner, one at a time, and every learner posts all of them (the rest at its end), so each
completes once the slowest learner has posted it. Training never waits on them: in flight they
are tested at each step boundary; only :meth:`GossipModel.finish` waits, after the gossip's
goodbyes, when no learner needs another's answer any more.

Checkpoints (``pserver.ckpt.records.gossip``, the cut): :meth:`GossipModel.finish` first agrees with
the other learners (:class:`pserver.ckpt.drivers.gossip.CutAgreement`, on a communicator of its
own, so it cannot be matched with an epoch's allreduce still in flight) whether any was
stopped by a signal and up to which epoch K some learner has joined the averages. Stopped:
every learner joins the averages up to K and stops there (no final average; the resumed run
starts at epoch K + 1, ``resumed``); not stopped: as above. Every learner reaches the
agreement (its loop ends, by the signal or by the data server's stop) and all of them then
post the same allreduces, so the liveness argument holds as it is. A run resumed after its
last epoch was averaged (more of the same ``run.epochs``) reports no second final model.

A lost learner (issue 22, ``pserver.roles.gossip``): the averages run on the learners'
communicator, which the gossip revokes when a learner dies (and the cut's, :meth:`revoke`), so an
average in flight fails on every survivor; every wait here ends on the gossip's ``check()``
(broken) as well. At the gossip's repair (:meth:`repaired`, collective over the survivors, in
the same order everywhere) the survivors agree on how many epochs of the common sequence every
one of them completed (an allreduce MIN); the epochs after that are averaged again from there,
in order, over the shrunk communicator and divided by λ′ (learner 0 does not send one twice;
the first survivor reports them when learner 0 was the one lost).
From then on a step counts λ′ minibatches (:meth:`minibatches`). :meth:`finish` returns False
when the ring broke under it: the exchange then says its goodbyes in the new ring and calls it
again. Liveness: as above, on the survivors' communicator; a survivor that is waiting in an
average sees the failure through ``check()`` and goes to the shrink with the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from pserver.ckpt.drivers.gossip import CutAgreement
from pserver.ckpt.records.gossip import minibatches_to, owed
from pserver.comm.collectives import Allreducer, CollectiveLost, Handle
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.lockstep import total_minibatches
from pserver.protocols.ring import averages_again, sum_to_mean
from pserver.roles.exchange import LearnerSide
from pserver.roles.model_report import ModelReport

#: what a failed average raises: the MPI error, or the allreducer's wrapping of a learner's
#: loss (``pserver.comm.collectives.fail_fast``); either breaks the ring (module docstring)
LOSSES = (MPI.Exception, CollectiveLost)


def mpi_error(e: BaseException) -> BaseException:
    """The MPI error under a :class:`CollectiveLost` (the gossip's ``fail`` judges it)."""
    return e.error if isinstance(e, CollectiveLost) else e


class GossipModel:
    """One learner's part in the epoch averages (see the module docstring)."""

    def __init__(self, side: LearnerSide, weights: Any, lock: Any) -> None:
        comm = side.learner_comm
        self.side, self.xp, self.lock = side, side.xp, lock
        self.lam = comm.Get_size()
        self.last_epoch = side.cfg.run.epochs
        self.total = total_minibatches(side.cfg, side.train_size)
        self.counter = EpochCounter.from_config(side.cfg, side.train_size)
        self.batch = side.cfg.data.batch_size
        self.waiter = side.waiter()
        self.buf = self.xp.empty_like(weights)
        self.red = Allreducer(
            comm, side.backend, self.waiter, weights.size, weights.dtype,
            bucket_mib=side.cfg.comm.bucket_mib, staging=side.cfg.comm.staging,
        )  # fmt: skip
        self.report = ModelReport(side.stats_link(), side.layout.index(side.rank), side.blocks,
                                  side.model_bytes, weights.dtype)  # fmt: skip
        self.due: deque[int] = deque()  # tested epochs (< the last) not yet averaged
        self.inflight: tuple[int, int, Handle] | None = None  # epoch, step, handle
        self.cut = CutAgreement(comm, self.waiter)  # collective: every learner builds one now
        self.stopped = False  # this learner was stopped by a signal (the trainer says)
        self.final_reported = False  # resumed after the last epoch's average was reported
        # a lost learner (module docstring); the exchange sets ``broken`` / ``fail``
        self.broken: Callable[[], bool] = lambda: False
        self.check: Callable[[], bool] = lambda: False  # broken, looking at the failed list
        self.fail: Callable[[BaseException], None] = self._raise
        self.completed: list[int] = []  # the epochs whose average completed here, in order
        self.sent: set[int] = set()  # the epochs learner 0 reported (never twice)
        self.base_steps, self.base_count = 0, 0  # a step's count of minibatches since then
        self.steps = 0  # the learner's steps so far (stepped())
        self.comm = comm

    @staticmethod
    def _raise(error: BaseException) -> None:
        raise error

    def minibatches(self, steps: int) -> int:
        """The run's minibatches taken after this learner's ``steps``-th update, were every
        learner at its pace: λ a step (λ′ after a loss, counted from the repair)."""
        return self.base_count + (steps - self.base_steps) * self.lam

    def stepped(self, w: Any, steps: int) -> bool:
        """After the learner's ``steps``-th update (main thread): the epochs it ended; whether
        one of them is tested."""
        self.steps = steps
        ends = self.counter.advance(min(self.minibatches(steps), self.total))
        self.due.extend(e for e in ends.tested if e < self.last_epoch)
        self.poll(w, steps)
        return bool(ends.tested)

    def poll(self, w: Any, steps: int) -> None:
        """Report a completed average; post the next one due (never waits)."""
        if self.broken():
            return  # the gossip repairs first; the averages then go on (repaired())
        try:
            if self.inflight is not None and self.inflight[2].test():
                self.reported()
            if self.inflight is None and self.due:
                with self.lock:  # a consistent model: no average of the gossip falls in the copy
                    self.xp.copyto(self.buf, w)
                self.inflight = (self.due[0], steps, self.red.start(self.buf))
                self.due.popleft()
        except LOSSES as e:
            self.fail(mpi_error(e))

    def reported(self) -> None:
        assert self.inflight is not None
        epoch, steps, _ = self.inflight
        sum_to_mean(self.xp, self.buf, self.lam)
        if epoch not in self.sent:
            self.report.send(self.buf, epoch, steps)
            self.sent.add(epoch)
        self.completed.append(epoch)
        self.inflight = None

    # -- a lost learner (module docstring) -----------------------------------------------------

    def revoke(self) -> None:
        """The ring broke: the cut's communicator too (the averages' is the gossip's)."""
        if self.cut.comm != MPI.COMM_NULL:
            try:
                self.cut.comm.Revoke()
            except MPI.Exception:
                pass  # revoked by another survivor already

    def repaired(self, comm: MPI.Comm) -> None:
        """The gossip shrank the learners' communicator to ``comm`` (collective, every
        survivor at this point): agree where the averages go on, rebuild on ``comm``."""
        common = int(comm.allreduce(len(self.completed), op=MPI.MIN))
        inflight = self.inflight[0] if self.inflight is not None else None
        self.completed, again = averages_again(self.completed, inflight, self.due, common)
        self.due, self.inflight = deque(again), None
        self.base_count, self.base_steps = self.minibatches(self.steps), self.steps
        self.comm, self.lam = comm, comm.Get_size()
        self.red = Allreducer(
            comm, self.side.backend, self.waiter, self.buf.size, self.buf.dtype,
            bucket_mib=self.side.cfg.comm.bucket_mib, staging=self.side.cfg.comm.staging,
        )  # fmt: skip
        self.cut = CutAgreement(comm, self.waiter)
        # the first survivor reports (learner 0's successor, when it was the one lost)
        self.report.sends = comm.Get_rank() == 0

    def until(self, done: Callable[[], bool], what: str) -> bool:
        """Wait for ``done()`` or a broken ring; whether it was done (a failure breaks it)."""

        def ready() -> bool:
            if self.check():
                return True
            try:
                return done()
            except LOSSES as e:
                self.fail(mpi_error(e))
                return True

        self.waiter.until(ready, what)
        return not self.broken()

    def settle(self) -> None:
        """Wait until the snapshots sent so far have reached the statistics server (learner 0;
        the end of the run, where waiting is fine)."""
        for snaps in self.report.snaps if self.report.sends else ():
            while snaps.reqs or snaps.queued:
                self.waiter.waitall(snaps.reqs, "the statistics server to take a model snapshot")
                snaps.advance()  # the completed requests cleared, the next queued one posted

    def resumed(self, next_epoch: int) -> None:
        """Continue a checkpointed run whose averages were taken up to ``next_epoch - 1``."""
        self.counter.next_epoch = next_epoch
        self.final_reported = next_epoch > self.last_epoch

    def finish(self, w: Any, steps: int) -> bool:
        """Every epoch still owed (with the final model), then the final average; the
        statistics server gets the last epoch's test and the dump's final model from it.
        Stopped by a signal (any learner): the averages up to the agreed cut only."""
        try:
            agreed = self.cut.agree_until(
                self.stopped, owed(self.counter.next_epoch, self.last_epoch), self.until
            )  # fmt: skip
        except LOSSES as e:
            self.fail(mpi_error(e))
            return False
        if agreed is None:
            return False  # the ring broke: goodbyes in the new one, then again
        stopped, cut = agreed
        if stopped:
            ends = self.counter.advance(minibatches_to(cut, self.side.train_size, self.batch))
            # the same on every learner, also one whose own count ended the last epoch
            self.counter.next_epoch = cut + 1
        else:
            ends = self.counter.advance(self.total)
        self.due.extend(e for e in ends.tested if e < self.last_epoch)
        while self.inflight is not None or self.due:
            if self.inflight is not None:
                if not self.until(self.inflight[2].test,
                                  f"the learners' average model of epoch {self.inflight[0]}"):
                    return False
                self.settle()  # owed epochs come in a burst: none may find the queue full
                self.reported()
            self.poll(w, steps)
            if self.broken():
                return False
        self.settle()
        if stopped or self.final_reported:  # the resumed run (or the last one) averages it
            self.cut.free()
            self.report.drain(self.buf, steps, self.waiter)
            return True
        self.xp.copyto(self.buf, w)
        try:
            final = self.red.start(self.buf)
        except LOSSES as e:
            self.fail(mpi_error(e))
            return False
        if not self.until(final.test, "the learners' final average model"):
            return False
        self.cut.free()
        sum_to_mean(self.xp, self.buf, self.lam)
        self.report.send(self.buf, self.last_epoch, steps)
        self.report.drain(self.buf, steps, self.waiter)
        return True
