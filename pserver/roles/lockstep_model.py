"""The model a learner of a lockstep strategy (SYNC, HYBRID) keeps, and what happens to it.

Used by composition by the exchanges of ``pserver.roles.allreduce`` and ``pserver.roles.hybrid``:
they move the gradients (an allreduce, now or one step late); this object applies each
averaged gradient with the learner's own update rule (``pserver.optim.local_update``: the shards'
rules, schedules and weight decay), keeps the staleness count, decides from the run plan
(``pserver.protocols.lockstep.RunPlan``: the same on every learner) when an epoch ends, measures the
learners' drift then (``pserver.roles.drift``) and reports the model for the epoch's test
(``pserver.roles.model_report``), and writes the ``exchanges`` and ``drift`` rows.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from pserver.comm.collectives import CollectiveLost, FailFastWaiter, survivable
from pserver.optim.local_update import LocalUpdate
from pserver.protocols.lockstep import ModelVersion, RunPlan
from pserver.roles.drift import Drift
from pserver.roles.exchange import LearnerSide
from pserver.roles.model_report import ModelReport


class LockstepModel:
    def __init__(self, side: LearnerSide, weights: Any) -> None:
        comm = side.learner_comm
        self.side, self.w, self.comm, self.backend = side, weights, comm, side.backend
        self.n_learners = comm.Get_size()
        self.index = side.layout.index(side.rank)
        self.waiter = side.waiter()
        self.plan = RunPlan.from_config(side.cfg, side.train_size, self.n_learners)
        # IBM Fig. 3a: the average of λ local steps at α0 = one step at α0 with the average
        self.update = LocalUpdate(side.cfg.optim, weights.size, side.xp, weights.dtype)
        self.report = ModelReport(side.stats_link(), side.layout.index(side.rank), side.blocks,
                                  side.model_bytes, weights.dtype)  # fmt: skip
        # a lost learner (ULFM) ends a drift check with CollectiveLost (the exchange regroups)
        fail_fast = FailFastWaiter(self.waiter)
        self.drift = Drift(comm, side.backend, fail_fast, weights.size, weights.dtype)  # type: ignore[arg-type]
        self.versions = ModelVersion()  # averaged gradients applied so far (its timestamp)
        self.records: Any = None  # the trainer's RecordBuffer (``attach``)
        self.nbytes = weights.size * weights.dtype.itemsize

    @property
    def version(self) -> int:
        return self.versions.value

    @version.setter
    def version(self, value: int) -> None:
        self.versions.value = value

    @property
    def steps(self) -> int:
        """Steps every learner takes (``RunPlan``): the same on all, or an allreduce hangs."""
        return self.plan.steps

    def apply(
        self, g_sum: Any, step: int, computed_at: int, waited: float,
        contributions: int | None = None, drift: bool = True,
    ) -> None:  # fmt: skip
        """Apply the sum of the λ gradients of ``step`` (computed on model version
        ``computed_at``), then the epoch ends that step completes, and its ``exchanges`` and
        ``staleness`` rows.

        ``contributions``: the gradients in the sum when not the current λ (a sum completed
        with a learner since lost, taken after a regroup: ``pserver.roles.allreduce``);
        ``drift=False`` skips the (collective) drift check, which the other survivors skipped
        in that regroup. A drift check that a lost learner ends raises :class:`CollectiveLost`
        once the rest is done (the rows, the epoch's model report)."""
        # σ (docs/stats.md, *Staleness σ*): averaged updates applied since the version this
        # learner's gradient was computed on — SYNC 0, HYBRID 1 (IBM Table 1), measured here
        sigma = self.versions.applied(computed_at)
        n = self.n_learners if contributions is None else contributions
        self.update.step(self.w, g_sum, self.plan.epoch(step), divisor=float(n))
        self.row(step, computed_at, sigma, waited)
        ends = self.plan.ends(step)
        lost: CollectiveLost | None = None
        for epoch in ends.ended:  # the same step on every learner: the drift is collective
            if drift and lost is None:
                try:
                    self.measure_drift(epoch)
                except CollectiveLost as e:
                    lost = e
        if ends.tested:  # this epoch's rows before its model: the progress line counts them
            self.records.send()
        for epoch in ends.tested:
            self.report.send(self.w, epoch, self.version)
        if lost is not None:
            raise lost

    def row(self, step: int, computed_at: int, sigma: int, waited: float) -> None:
        """One row per learner and step: its own gradient is one of the λ contributions of the
        step's update, applied to its copy of the weights (all copies are equal)."""
        now = self.side.now()
        self.records.add(
            "exchanges", learner=self.index, step=step, partner=-1, partner_age=-1,
            partner_step=-1, bytes=self.nbytes, wait_time=waited, time=now,
        )  # fmt: skip
        self.records.add(
            "staleness", learner=self.index, owner=self.index, version=computed_at,
            staleness=sigma, time=now,
        )  # fmt: skip

    def measure_drift(self, epoch: int) -> None:
        try:
            diff, where = self.drift.measure(self.w)
        except MPI.Exception as e:  # posted on a communicator revoked after a loss
            if not survivable(self.waiter, e):
                raise
            raise CollectiveLost(e) from e
        if self.index == 0:
            self.records.add("drift", epoch=epoch, time=self.side.now(), max_diff=diff,
                             learner=where)  # fmt: skip
            if diff:
                self.side.log.warning("epoch %d: learner %d drifted %.3g from learner 0",
                                     epoch, where, diff)  # fmt: skip

    def finish(self) -> None:
        """The queued snapshots and the final model (learner 0), once training is over."""
        self.report.drain(self.w, self.version, self.waiter)
