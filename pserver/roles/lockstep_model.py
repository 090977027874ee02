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

from pserver.optim.local_update import LocalUpdate
from pserver.protocols.lockstep import RunPlan
from pserver.roles.drift import Drift
from pserver.roles.model_report import ModelReport
from pserver.runtime.context import Context


class LockstepModel:
    def __init__(self, ctx: Context, weights: Any) -> None:
        comm = ctx.learner_comm
        self.ctx, self.w, self.comm, self.backend = ctx, weights, comm, ctx.backend
        self.n_learners = comm.Get_size()
        self.index = ctx.layout.index(ctx.rank)
        self.waiter = ctx.waiter()
        self.plan = RunPlan.from_config(ctx.cfg, ctx.train_size, self.n_learners)
        # IBM Fig. 3a: the average of λ local steps at α0 = one step at α0 with the average
        self.update = LocalUpdate(ctx.cfg.optim, weights.size, ctx.xp, weights.dtype)
        self.report = ModelReport(ctx, weights.dtype)
        self.drift = Drift(comm, ctx.backend, self.waiter, weights.size, weights.dtype)
        self.version = 0  # averaged gradients applied so far (the model's timestamp)
        self.records: Any = None  # the trainer's RecordBuffer (``attach``)
        self.nbytes = weights.size * weights.dtype.itemsize

    @property
    def steps(self) -> int:
        """Steps every learner takes (``RunPlan``): the same on all, or an allreduce hangs."""
        return self.plan.steps

    def apply(self, g_sum: Any, step: int, computed_at: int, waited: float) -> None:
        """Apply the sum of the λ gradients of ``step`` (computed on model version
        ``computed_at``), then the epoch ends that step completes, and its ``exchanges`` and
        ``staleness`` rows."""
        # σ (docs/stats.md, *Staleness σ*): averaged updates applied since the version this
        # learner's gradient was computed on — SYNC 0, HYBRID 1 (IBM Table 1), measured here
        sigma = self.version - computed_at
        self.update.step(self.w, g_sum, self.plan.epoch(step), divisor=float(self.n_learners))
        self.version += 1
        self.row(step, computed_at, sigma, waited)
        ends = self.plan.ends(step)
        for epoch in ends.ended:  # the same step on every learner: the drift is collective
            self.measure_drift(epoch)
        if ends.tested:  # this epoch's rows before its model: the progress line counts them
            self.records.send()
        for epoch in ends.tested:
            self.report.send(self.w, epoch, self.version)

    def row(self, step: int, computed_at: int, sigma: int, waited: float) -> None:
        """One row per learner and step: its own gradient is one of the λ contributions of the
        step's update, applied to its copy of the weights (all copies are equal)."""
        now = self.ctx.now()
        self.records.add(
            "exchanges", learner=self.index, step=step, partner=-1, partner_age=-1,
            partner_step=-1, bytes=self.nbytes, wait_time=waited, time=now,
        )  # fmt: skip
        self.records.add(
            "staleness", learner=self.index, owner=self.index, version=computed_at,
            staleness=sigma, time=now,
        )  # fmt: skip

    def measure_drift(self, epoch: int) -> None:
        diff, where = self.drift.measure(self.w)
        if self.index == 0:
            self.records.add("drift", epoch=epoch, time=self.ctx.now(), max_diff=diff,
                             learner=where)  # fmt: skip
            if diff:
                self.ctx.log.warning("epoch %d: learner %d drifted %.3g from learner 0",
                                     epoch, where, diff)  # fmt: skip

    def finish(self) -> None:
        """The queued snapshots and the final model (learner 0), once training is over."""
        self.report.drain(self.w, self.version, self.waiter)
