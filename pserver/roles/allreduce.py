"""SYNC's learner exchange (IBM, Zhang et al., §3, "SYNC"): allreduce the gradients, apply the
average, every step.

Each step a learner computes its gradient, the λ gradients are summed in place by a bucketed
non-blocking allreduce on the learners' communicator (``pserver.comm.collectives.Allreducer``,
``comm.bucket_mib``, GPU arrays staged through pinned host buffers unless MPI is CUDA-aware),
waited with the Waiter's back-off (a blocking ``MPI_Allreduce`` would spin a core while a slow
learner computes), and every learner applies the average with its own copy of the update rule
(``pserver.roles.lockstep_model``). Every learner applies the same averages in the same order
from the same w0, so the models stay equal (the ``drift`` rows check it every epoch) and every
gradient is computed on the current model: σ = 0.

Liveness: the allreduce of step k completes once every learner has started it. Every learner
starts exactly one allreduce per step, with the same buckets, and takes the same number of
steps S (``pserver.protocols.lockstep.RunPlan``: a function of the config and λ, not of arrival
order),
and the data server serves each learner exactly S minibatches (``DataQuota``), so a learner
reaching step k < S always gets its minibatch and starts allreduce k. The per-epoch drift
check and the epoch ends fall on the same step index on every learner. A learner that fails
aborts the job (``pserver.job.cli``): nobody waits for it forever. After the last step no learner
expects anything of another (the goodbyes go to the data and statistics servers).

A lost learner under Open MPI's ULFM (issue 22, :class:`Regroup`): its allreduce fails on some
survivors (``CollectiveLost``), and may complete on others that it had already reached. The
first to fail revokes the learners' communicator, so every survivor's next operation on it
fails too, and every survivor regroups: ``MPI_Comm_agree`` on the old communicator (which
returns on all or raises on all: a survivor that finished its steps takes part through the
end agreement of :meth:`Regroup.end`), the blocking shrink to the survivors, and an allgather
of each one's count of applied averages. The counts differ by at most one
(:func:`pserver.comm.collectives.reconcile`): a survivor behind takes the sum the others
completed (the dead learner's gradient of that step is in it, divided by the old λ) from the
first survivor ahead; then the step every survivor is at is (re)done over the survivors, whose
mean divides by the new size. Only the dead learner's gradient of that step is lost; the
models stay equal (the ``drift`` rows check it). The steps S stay those of the plan: the
data server serves each survivor its S minibatches and stops expecting the dead learner
(``pserver.roles.dataserver``). A second loss during a regroup ends the job, naming it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver.ckpt.drivers.lockstep import model_state, restore_model
from pserver.ckpt.files import State
from pserver.comm.collectives import Allreducer, CollectiveLost, gone, reconcile, survivable
from pserver.comm.waiting import ALLREDUCE_PEERS
from pserver.roles.exchange import Exchange, LearnerSide
from pserver.roles.lockstep_model import LockstepModel
from pserver.roles.stop_vote import stop_vote


def allreducer(side: LearnerSide, model: LockstepModel, weights: Any) -> Allreducer:
    c = side.cfg.comm
    return Allreducer(
        side.learner_comm, side.backend, model.waiter, weights.size, weights.dtype,
        bucket_mib=c.bucket_mib, staging=c.staging,
    )  # fmt: skip


class Regroup:
    """The survivors' regroup after a lost learner (ULFM; see the module docstring). None
    of it runs without departures: then a lost learner ends the job as before."""

    def __init__(self, side: LearnerSide, model: LockstepModel, allreduce: Allreducer) -> None:
        self.side, self.model, self.allreduce = side, model, allreduce
        self.xp, self.backend = side.xp, side.backend
        w = model.w
        self.own = side.xp.empty_like(w)  # this step's own gradient (the sum is in place)
        self.last = np.empty(w.size, dtype=w.dtype)  # the last sum applied, for a survivor behind
        self.world = side.peers.departures.world  # regroup() makes one only with departures
        self.vote: Any = None  # the exchange's stop vote, turned off at a regroup

    def keep(self, g: Any) -> None:
        """Before the allreduce: a copy of this learner's own gradient, to redo the sum with."""
        self.xp.copyto(self.own, g)

    def restore(self, g: Any) -> None:
        self.xp.copyto(g, self.own)

    def applied(self, g_sum: Any) -> None:
        """The sum about to be applied (the update may change its buffer)."""
        self.backend.copy_to_host(g_sum, self.last)

    def run(self, applied: int, error: CollectiveLost | MPI.Exception | None) -> tuple[int, int]:
        """Regroup with the other survivors; ``applied``: the averages this learner applied.
        Returns ``(lo, hi)`` (:func:`reconcile`); a learner at ``lo < hi`` finds the sum of
        step ``lo`` in :attr:`last` afterwards."""
        m = self.model
        old = m.comm
        if self.vote is not None:
            self.vote.abandon()  # its pending vote needs the dead learner: no survivor waits
        old.Revoke()  # every survivor's next operation on it fails: all come here
        try:
            old.Agree(0)  # meets the others' regroups and end agreements (module docstring)
        except MPI.Exception as e:
            if not survivable(m.waiter, e):
                raise m.waiter.peers.lost("the learners' agreement after a loss", e) from e
        new = old.Shrink()
        lost = gone(old, new, self.world)
        d = m.waiter.peers.departures
        if d is not None:
            d.absorb()  # the dead learners' failure, read and acknowledged here too
        counts = new.allgather(applied)
        lo, hi, root = reconcile(counts)
        if lo < hi:
            new.Bcast(self.last, root=root)
        before = m.n_learners
        m.comm, m.n_learners = new, new.Get_size()
        m.drift.comm = new
        m.report.sends = new.Get_rank() == 0  # the first learner left reports the model
        self.allreduce.rebind(new)
        names = ", ".join(self.side.peers.name(r) for r in lost) if lost else "a learner"
        took = f"took the others' sum of step {lo}, then " if applied < hi else ""
        self.side.log.warning(
            "learners regrouped after losing %s (%s): λ %d -> %d; %sthe sum of step %d is "
            "redone over the survivors", names, error if error is not None else "end agreement",
            before, m.n_learners, took, hi,
        )  # fmt: skip
        return lo, hi

    def end(self, applied: int, behind: Any) -> None:
        """After the last step: ``MPI_Comm_agree`` that every learner finished (uniform: a
        survivor still regrouping makes it fail or return 0 on all, and all regroup).
        ``behind(sum_host)``: how a learner at ``lo`` applies the others' last sum."""
        while True:
            try:
                if self.model.comm.Agree(1) == 1:
                    return
                error = None
            except MPI.Exception as e:
                if not survivable(self.model.waiter, e):
                    raise self.model.waiter.peers.lost("the learners' end agreement", e) from e
                error = e
            lo, hi = self.run(applied, error)
            if applied < hi:
                behind(self.last)
                applied = hi


def regroup(side: LearnerSide, model: LockstepModel, allreduce: Allreducer) -> Regroup | None:
    """A :class:`Regroup` where the run survives a lost learner (ULFM), else None."""
    return Regroup(side, model, allreduce) if side.peers.departures is not None else None


class SyncExchange(Exchange):
    """The allreduce of every step's gradient, waited for before the update (σ = 0)."""

    votes_on_stop = True  # every learner stops at the boundary its vote agrees on
    freeze_after_weights = False
    relayed_bytes = 0

    def __init__(self, side: LearnerSide, weights: Any) -> None:
        self.model = LockstepModel(side, weights)
        self.waiter = self.model.waiter
        self.grad = side.xp.empty_like(weights)
        self.allreduce = allreducer(side, self.model, weights)
        self.steps = 0
        self.have = {0: 0}  # the model's version (for the divergence report)
        # where a signal stops every learner
        self.vote = stop_vote(side.cfg, side.learner_comm, self.waiter)
        self.regroup = regroup(side, self.model, self.allreduce)  # a lost learner (ULFM)
        if self.regroup is not None:
            self.regroup.vote = self.vote

    def attach(self, records: Any) -> None:
        self.model.records = records

    def weights(self) -> Any | None:
        return None if self.steps >= self.model.steps else self.model.w

    def gradient_buffer(self) -> Any:
        return self.grad

    def gradient(self, g: Any) -> None:
        t = time.perf_counter()
        rg = self.regroup
        if rg is not None:
            rg.keep(g)
        while True:
            try:
                self.allreduce.start(g).wait(f"the allreduce of step {self.steps}'s gradients")
                break
            except CollectiveLost as e:
                if rg is None:
                    raise e.error from e
                before = self.model.n_learners
                lo, hi = rg.run(self.steps, e)
                if self.steps < hi:  # the others completed this step's sum: apply theirs
                    self.behind(rg.last, before, time.perf_counter() - t)
                    return
                rg.restore(g)  # redo this step's sum over the survivors
        self.waiter.peers.note(ALLREDUCE_PEERS, f"the sum of step {self.steps}'s gradients")
        self.land(g, time.perf_counter() - t)

    def land(self, g: Any, waited: float, contributions: int | None = None,
             drift: bool = True) -> None:  # fmt: skip
        """Apply the sum ``g`` of step ``steps``; a drift check a loss ends regroups."""
        rg = self.regroup
        if rg is not None:
            rg.applied(g)
        try:
            self.model.apply(g, self.steps, self.model.version, waited, contributions, drift)
        except CollectiveLost as e:
            if rg is None:
                raise e.error from e
            self.steps += 1
            self.have[0] = self.model.version
            lo, hi = rg.run(self.steps, e)  # this learner is at hi: it applied the step
            return
        self.steps += 1
        self.have[0] = self.model.version

    def behind(self, last: np.ndarray, contributions: int, waited: float) -> None:
        """Apply the sum of this step that the other survivors completed before the loss
        (``last``, from the regroup) with the λ it was summed over, without the drift check
        the others skipped in the regroup."""
        self.backend_copy(last, self.grad)
        self.land(self.grad, waited, contributions, drift=False)

    def backend_copy(self, host: np.ndarray, out: Any) -> None:
        self.model.side.backend.copy_from_host(host, out)

    def staleness(self) -> tuple[float, int]:
        return 0.0, 0

    def done(self) -> float:
        if self.vote is not None:
            self.vote.finish()
        if self.regroup is not None:  # every survivor ends here: the end agreement
            n = self.model.n_learners
            self.regroup.end(self.steps, lambda last: self.behind(last, n, 0.0))
        return 0.0

    def close(self) -> None:
        if self.vote is not None:
            self.vote.close()

    def finish(self) -> None:
        self.model.finish()

    # -- checkpoints (pserver.ckpt.drivers.end, pserver.ckpt.drivers.lockstep)
    # ----------------------

    def stop_agreed(self) -> bool:
        """At step boundary ``steps``: stop here (every learner the same step: the vote of
        ``pserver.roles.stop_vote``, which posts none past the plan's last step)."""
        return self.vote is not None and self.vote.boundary(self.steps + 1 < self.model.steps)

    def state(self) -> State:
        s = model_state(self.model)
        return State(s.arrays, {**s.attrs, "steps": self.steps})

    def restore(self, state: State) -> None:
        restore_model(self.model, state)
        self.steps = int(state.attrs["steps"])
        self.have[0] = self.model.version
