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
"""

from __future__ import annotations

import time
from typing import Any

from pserver.ckpt.drivers.lockstep import model_state, restore_model
from pserver.ckpt.files import State
from pserver.comm.collectives import Allreducer
from pserver.comm.waiting import ALLREDUCE_PEERS
from pserver.roles.exchange import Exchange
from pserver.roles.lockstep_model import LockstepModel
from pserver.roles.stop_vote import stop_vote
from pserver.runtime.context import Context


def allreducer(ctx: Context, model: LockstepModel, weights: Any) -> Allreducer:
    c = ctx.cfg.comm
    return Allreducer(
        ctx.learner_comm, ctx.backend, model.waiter, weights.size, weights.dtype,
        bucket_mib=c.bucket_mib, staging=c.staging,
    )  # fmt: skip


class SyncExchange(Exchange):
    """The allreduce of every step's gradient, waited for before the update (σ = 0)."""

    votes_on_stop = True  # every learner stops at the boundary its vote agrees on
    freeze_after_weights = False
    relayed_bytes = 0

    def __init__(self, ctx: Context, weights: Any) -> None:
        self.model = LockstepModel(ctx, weights)
        self.waiter = self.model.waiter
        self.grad = ctx.xp.empty_like(weights)
        self.allreduce = allreducer(ctx, self.model, weights)
        self.steps = 0
        self.have = {0: 0}  # the model's version (for the divergence report)
        self.vote = stop_vote(ctx, self.waiter)  # where a signal stops every learner

    def attach(self, records: Any) -> None:
        self.model.records = records

    def weights(self) -> Any | None:
        return None if self.steps >= self.model.steps else self.model.w

    def gradient_buffer(self) -> Any:
        return self.grad

    def gradient(self, g: Any) -> None:
        t = time.perf_counter()
        self.allreduce.start(g).wait(f"the allreduce of step {self.steps}'s gradients")
        self.waiter.peers.note(ALLREDUCE_PEERS, f"the sum of step {self.steps}'s gradients")
        waited = time.perf_counter() - t
        self.model.apply(g, self.steps, self.model.version, waited)
        self.steps += 1
        self.have[0] = self.model.version

    def staleness(self) -> tuple[float, int]:
        return 0.0, 0

    def done(self) -> float:
        if self.vote is not None:
            self.vote.finish()
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
