"""HYBRID's learner exchange (IBM, Zhang et al., §3 and Fig. 3): SYNC's allreduce, overlapped
with the next gradient, so every gradient is applied one step late (staleness 1).

Step k: the learner computes g_k into one of two gradient buffers, then waits for the
allreduce of g_{k-1} (started at step k-1, progressed since by the communication thread of
the comm engine, ``pserver.comm.engine``, while g_k was computed), applies the average of
g_{k-1} (``pserver.roles.lockstep_model``) and starts the allreduce of g_k in the other buffer.
So g_k is computed on the model with g_0 … g_{k-2} applied and lands after g_{k-1}: σ = 1
(σ = 0 for g_0, which lands on w0). Exactly one allreduce is in flight; the buffer it sums in
place is never the one the next gradient is computed into (separate send and receive
buffers, alternating). The last gradient lands in ``done()``, after the last step, so every
gradient is applied. ``learners.serial.train_serial_delayed`` is the serial reference.

The communication thread calls MPI beside the compute thread (and the prefetch thread), in
every ``comm.mode`` (the overlap is what HYBRID is): MPI_THREAD_MULTIPLE is needed, checked
before training (``pserver.runtime.context.check_exchange_thread``).

Liveness: as SYNC's (``pserver.roles.allreduce``): every learner starts one allreduce per
step, in the same order, for the same S steps (``pserver.protocols.lockstep.RunPlan``), and waits
for
it at its next step or in ``done()``; the thread tests it with back-off until it completes,
and a wait ends once it has (``CommEngine.wait``: the condition is evaluated after every
progress that completed a bucket). The drift collectives at an epoch end run with no
allreduce in flight, at the same step index on every learner.

A lost learner under Open MPI's ULFM (issue 22): SYNC's regroup
(:class:`pserver.roles.allreduce.Regroup`). The communication thread that sees the allreduce
fail keeps the error (:attr:`HybridExchange.lost`) and drops the operation; the learner's
thread, waiting in :meth:`HybridExchange.land`, regroups with the other survivors (no MPI on
the learners' communicator runs in the thread meanwhile: nothing is in flight). The count of
applied averages says where each survivor is: one behind applies the sum of step ``f`` the
others completed, then starts step ``f + 1`` as usual; one at the top redoes the sum in flight
with its own gradient (kept when it was started) over the survivors.
"""

from __future__ import annotations

from typing import Any

from pserver.ckpt.drivers.lockstep import HybridCut
from pserver.ckpt.files import State
from pserver.comm.collectives import CollectiveLost, Handle
from pserver.comm.engine import CommEngine
from pserver.comm.waiting import ALLREDUCE_PEERS
from pserver.roles.allreduce import allreducer, regroup
from pserver.roles.exchange import Exchange, LearnerSide
from pserver.roles.lockstep_model import LockstepModel
from pserver.roles.stop_vote import stop_vote


class HybridExchange(Exchange):
    """One allreduce in flight in the comm engine; each gradient applied a step late."""

    votes_on_stop = True  # every learner stops at the boundary its vote agrees on
    freeze_after_weights = False
    relayed_bytes = 0

    def __init__(self, side: LearnerSide, weights: Any) -> None:
        self.model = LockstepModel(side, weights)
        self.waiter = self.model.waiter
        self.bufs = (side.xp.empty_like(weights), side.xp.empty_like(weights))
        self.allreduce = allreducer(side, self.model, weights)
        self.flight: Handle | None = None
        self.pending = False  # an allreduce was started and its average has not landed
        self.flight_step = self.flight_version = 0
        self.steps = 0
        self.have = {0: 0}
        self.backend, self.on_device = side.backend, False
        # where a signal stops every learner
        self.vote = stop_vote(side.cfg, side.learner_comm, self.waiter)
        self.cut = HybridCut(self.model)  # the model before the last landing, for checkpoints
        self.regroup = regroup(side, self.model, self.allreduce)  # a lost learner (ULFM)
        if self.regroup is not None:
            self.regroup.vote = self.vote
        self.lost: CollectiveLost | None = None  # the thread's failed allreduce (ULFM)
        self.engine = CommEngine(self.progress, self.waiter, threaded=True)  # any comm.mode
        self.engine.start()

    def attach(self, records: Any) -> None:
        self.model.records = records

    def progress(self) -> bool:
        """The engine's test (under its lock, on the communication thread alone): whether a
        bucket of the allreduce completed."""
        if not self.on_device:  # CUDA's current device is per thread: the staging copies of
            self.backend.activate()  # later buckets run here, on this rank's device
            self.on_device = True
        h = self.flight
        if h is None or h.done:
            return False
        seen = h.progress
        try:
            return h.test() or h.progress != seen
        except CollectiveLost as e:  # the learner's thread regroups (land); nothing in flight
            if self.regroup is None:
                raise
            self.lost, self.flight = e, None
            return True

    def weights(self) -> Any | None:
        return None if self.steps >= self.model.steps else self.model.w

    def gradient_buffer(self) -> Any:
        return self.bufs[self.steps % 2]  # not the one in flight (that is steps - 1's)

    def gradient(self, g: Any) -> None:
        computed_at = self.model.version  # g was computed before the previous average lands
        self.land()
        self.start(g, self.steps, computed_at)
        self.steps += 1

    def start(self, g: Any, step: int, computed_at: int) -> None:
        """Start the allreduce of step ``step``'s gradient ``g`` in the engine."""
        if self.regroup is not None:
            self.regroup.keep(g)  # to redo the sum with, should a learner be lost meanwhile
        with self.engine.lock:
            try:
                self.flight = self.allreduce.start(g)
            except CollectiveLost as e:  # posted on a revoked communicator: land() regroups
                if self.regroup is None:
                    raise
                self.flight, self.lost = None, e
        self.flight_step, self.flight_version = step, computed_at
        self.pending = True

    def land(self) -> float:
        """Wait for the allreduce in flight and apply its average; the seconds blocked."""
        if not self.pending:
            self.cut.land_saved()  # resumed: the checkpointed run's last landing, if any
            return 0.0
        step = self.flight_step
        what = f"the allreduce of step {step}"
        waited = self.engine.wait(lambda: self.lost is not None or self.flight.done, what)
        while self.lost is not None:  # a learner was lost (ULFM): regroup, then redo or take
            lost, self.lost = self.lost, None
            before = self.model.n_learners
            lo, hi = self.regroup.run(self.model.version, lost)  # type: ignore[union-attr]
            if self.model.version < hi:  # the others completed this sum: apply theirs
                self.pending = False
                self.behind(self.regroup.last, before, waited)  # type: ignore[union-attr]
                return waited
            self.regroup.restore(self.bufs[step % 2])  # type: ignore[union-attr]
            self.start(self.bufs[step % 2], step, self.flight_version)
            waited += self.engine.wait(lambda: self.lost is not None or self.flight.done, what)
        self.flight, self.pending = None, False
        self.waiter.peers.note(ALLREDUCE_PEERS, f"the sum of step {step}'s gradients")
        self.apply(self.bufs[step % 2], step, self.flight_version, waited)
        return waited

    def apply(self, g: Any, step: int, computed_at: int, waited: float,
              contributions: int | None = None, drift: bool = True) -> None:  # fmt: skip
        """Apply the sum ``g`` of ``step``; a drift check a lost learner ends regroups."""
        if self.regroup is not None:
            self.regroup.applied(g)
        try:
            self.model.apply(g, step, computed_at, waited, contributions, drift)
        except CollectiveLost as e:
            if self.regroup is None:
                raise e.error from e
            self.regroup.run(self.model.version, e)  # at the top: nothing to take or redo
        self.have[0] = self.model.version

    def behind(self, last: Any, contributions: int, waited: float) -> None:
        """Apply the sum of step ``flight_step`` the others completed before the loss, with the
        λ it was summed over, without the drift check the others skipped in the regroup."""
        g = self.bufs[self.flight_step % 2]
        self.backend.copy_from_host(last, g)
        self.apply(g, self.flight_step, self.flight_version, waited, contributions, False)

    def staleness(self) -> tuple[float, int]:
        return 0.0, 0

    def done(self) -> float:
        if self.vote is not None:
            self.vote.finish()
        self.cut.before_last_landing(self.pending or self.cut.post is not None)
        waited = self.land()  # the last gradient
        if self.regroup is not None:  # every survivor ends here: the end agreement
            n = self.model.n_learners
            self.regroup.end(self.model.version, lambda last: self.behind(last, n, 0.0))
        return waited

    def close(self) -> None:
        self.engine.close()
        if self.vote is not None:
            self.vote.close()

    def finish(self) -> None:
        self.model.finish()

    # -- checkpoints (pserver.ckpt.drivers.end, pserver.ckpt.drivers.lockstep)
    # ----------------------

    def stop_agreed(self) -> bool:
        """At step boundary ``steps``: stop here, on every learner the same step
        (``pserver.roles.stop_vote``); the average in flight lands in ``done()``."""
        return self.vote is not None and self.vote.boundary(self.steps + 1 < self.model.steps)

    def state(self) -> State:
        return self.cut.state(self.steps)

    def restore(self, state: State) -> None:
        self.steps = self.cut.restore(state)
        self.have[0] = self.model.version
