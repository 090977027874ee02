"""Stale Synchronous Parallel (Ho et al., NIPS 2013): asynchronous updates, bounded clock gap.

PSP-SGD §5 names SSP as the other way to weaken synchronization on the push side. Here it is
built on Rudra's Async (1-softsync): the block's weights are updated after every gradient, and
the only synchronization is a gate on *pulls*.

Semantics, per block:

* A learner's **clock** is the number of gradients of this block it has pushed, counted by the
  server in :meth:`StaleSynchronous.on_gradient` (accepted or not; SSP accepts all). It equals
  the learner's completed iterations because a learner pushes every live block once per
  iteration, and MPI's non-overtaking order puts its pushes before its next pull.
* A learner at clock ``c`` about to start iteration ``c`` (by pulling) may proceed iff
  ``c − min(clocks of the learners still running) <= s``; otherwise the server holds its pull
  until the slowest learner catches up. So the fastest learner is at most ``s`` iterations
  ahead of the slowest, and every pull it gets back contains all gradients from iterations
  ``0 .. c − s − 1`` of every learner (Ho et al.'s read guarantee), since each gradient updates
  the weights before the next message is handled.
* ``s = 0`` is lockstep pulls with asynchronous updates (BSP-like); ``s = ∞`` is plain Async.
* The slowest learner is never held (its gap is 0), so a held pull always becomes ready once
  the slowest learners push; a learner that has left (BYE) must be :meth:`retire`-d, otherwise
  its frozen clock would hold the others forever.

Learning rate: ``lr_policy`` as in Softsync — ``none`` (α0), ``mean`` (α0/max(⟨σ⟩, 1), eq. 6 of
Rudra), ``per-gradient`` (each gradient weighted 1/max(σ, 1)). With one gradient per update the
two modulations give the same step.
"""

from __future__ import annotations

from pserver.protocols.base import Arrival, GradientDecision
from pserver.protocols.rudra import Softsync

LR_POLICIES = ("none", "mean", "per-gradient")


class StaleSynchronous(Softsync):
    """SSP with staleness bound ``s`` over ``n_learners`` learners; one update per gradient."""

    name = "ssp"
    waits_for_update = False  # asynchronous pulls, gated by pull_ready() instead

    def __init__(self, n_learners: int, s: int, lr_policy: str) -> None:
        if lr_policy not in LR_POLICIES:
            raise ValueError(f"lr_policy = {lr_policy!r}: expected one of {LR_POLICIES}")
        if s < 0:
            raise ValueError(f"SSP needs a staleness bound s >= 0, got s = {s}")
        super().__init__(n_learners, n_learners, lr_policy)  # n = λ: update every gradient
        self.s = s
        self.clocks = [0] * n_learners
        self.running = set(range(n_learners))  # learners whose clock still bounds the others

    def on_gradient(self, arrival: Arrival, server_ts: int) -> GradientDecision:
        """Accept (as Async does) and advance the sender's clock."""
        self.check(arrival.learner)
        self.clocks[arrival.learner] += 1
        return super().on_gradient(arrival, server_ts)

    def min_clock(self) -> int | None:
        """The slowest running learner's clock; None once every learner has retired."""
        return min((self.clocks[i] for i in self.running), default=None)

    def pull_ready(self, learner: int, learner_clock: int | None = None) -> bool:
        """Whether ``learner`` may get weights now: ``clock − min_clock() <= s``.

        ``learner_clock`` defaults to the clock counted here (the gradients this block got from
        ``learner``); pass it when the learner reports its own iteration count instead.
        """
        self.check(learner)
        clock = self.clocks[learner] if learner_clock is None else learner_clock
        slowest = self.min_clock()
        return slowest is None or clock - slowest <= self.s

    def retire(self, learner: int) -> None:
        """``learner`` has finished: its clock no longer holds anyone back."""
        self.check(learner)
        self.running.discard(learner)

    def check(self, learner: int) -> None:
        if not 0 <= learner < len(self.clocks):
            raise ValueError(f"learner {learner} out of range 0..{len(self.clocks) - 1}")

    def describe(self) -> str:
        return f"ssp (s={self.s}, lr {self.lr_policy})"
