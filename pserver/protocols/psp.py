"""Partial pushing of PSP-SGD (Algorithm 1, server part; the paper's §2.3 and §3).

One instance per parameter block. Round ``t`` of a block is the interval in which its weights
sit at timestamp ``t``; it closes

* immediately at the ``c``-th accepted gradient when ``tau1 == 0`` (the paper's experiments),
* ``tau1`` seconds after the ``c``-th accepted gradient otherwise (line 12, "timeout τ1 after
  c gradients have been received"), or
* as soon as every learner has responded to this round (line 12, "or all workers have
  responded"), whichever comes first.

Which gradients a round takes and what "responded" means follow the push's timestamps
(:mod:`pserver.protocols.rounds`, where the liveness proof is): under the block rule a push
answers the round of the weights it was computed from (dropped when older, line 8); under the
iteration rule (with partial pulling) it answers the learner's iteration ``t'``, dropped only
when ``t' < t`` (line 7) and the weights are not this round's either. A stale push does *not*
count as a response to round t: it answers an earlier broadcast, and its sender is about to
pull w^t and answer this round. Were it counted, a straggler dropped in round t-1 would close
round t early with its stale push and be dropped again in round t+1, forever. Each learner
counts once per round; a second gradient from the same learner in one round is dropped.

Because readiness can turn true by time passing alone, :meth:`PartialPush.ready` takes the
current time and :meth:`PartialPush.deadline` tells the driver when to wake up.
"""

from __future__ import annotations

from pserver.protocols.base import Arrival, GradientDecision, Protocol, UpdateDecision
from pserver.protocols.rounds import SECOND, Rounds
from pserver.protocols.rudra import close_round

STALE = "stale: t' < t"
__all__ = ["SECOND", "STALE", "PartialPush"]


class PartialPush(Protocol):
    """Algorithm 1, server lines 4-14, for one block.

    ``c`` is the minimum number of aggregated gradients (1 <= c <= n_learners), ``tau1`` the
    timeout in seconds after the ``c``-th (0: close at once). The update follows line 13,
    ``w ← w − d·η·Updater(g/d)``: the driver divides the sum of the ``d`` accepted gradients by
    ``divisor = d`` and multiplies the base learning rate by ``lr_scale = d`` (the linear
    scaling rule of §2.2, η being the rate for one learner's minibatch).

    Learners compute every iteration on the current weights (``waits_for_update``), as in
    line 3 where the server broadcasts w^t before gathering round t.
    """

    name = "psp"
    waits_for_update = True

    def __init__(self, n_learners: int, c: int, tau1: float) -> None:
        super().__init__()
        if not 1 <= c <= n_learners:
            raise ValueError(f"partial pushing needs 1 <= c <= λ = {n_learners}, got c = {c}")
        if not tau1 >= 0.0:  # also rejects NaN
            raise ValueError(f"partial pushing needs a timeout tau1 >= 0, got {tau1}")
        self.n_learners = n_learners
        self.c = c
        self.tau1 = float(tau1)
        self.rounds = Rounds(n_learners, self.pending, STALE)
        self.c_time: float | None = None  # arrival time of this round's c-th accepted gradient
        self.last_time = float("-inf")  # latest arrival seen: "now" when ready() gets no time

    def on_gradient(self, arrival: Arrival, server_ts: int) -> GradientDecision:
        """Lines 6-11: drop t' < t, else add the gradient to this round (d ← d + 1)."""
        self.last_time = max(self.last_time, arrival.time)
        decision = self.rounds.judge(arrival, server_ts)  # raises if the copy is from the future
        if decision.accept and len(self.pending) == self.c:
            self.c_time = arrival.time  # line 12: the τ1 timer starts at the c-th gradient
        return decision

    def ready(self, now: float | None = None) -> bool:
        """Line 12's exit test at time ``now`` (default: the latest arrival's time)."""
        if self.rounds.all_responded():
            return True
        deadline = self.deadline()
        if deadline is None:
            return False  # fewer than c gradients: only arrivals can help
        if self.tau1 == 0.0:
            return True  # no timeout: the c-th gradient closes the round, whatever the clock
        return (self.last_time if now is None else now) >= deadline

    def retire(self, learner: int) -> None:
        """``learner`` computes no more (a signal or a periodic checkpoint's pause): a round
        no longer waits for it, so one that cannot reach ``c`` gradients closes once the
        learners still running have answered (their held pulls are then answered)."""
        self.rounds.retire(learner)

    def lose(self, learner: int) -> None:
        """A lost learner: rounds of the λ − 1 others, ``c`` at most λ − 1."""
        if learner in self.rounds.lost:
            return
        self.rounds.lose(learner)
        self.n_learners -= 1
        self.c = max(1, min(self.c, self.n_learners))

    def deadline(self) -> float | None:
        """When the round closes without another arrival: ``t_c + tau1``; None below ``c``.

        Once ``c`` gradients are in, ``ready(now)`` is true for every ``now >= deadline()``
        (the value may lie in the past: with ``tau1 == 0`` it is the c-th arrival's time).
        """
        if self.c_time is None:
            return None
        return self.c_time + self.tau1

    def commit(self, server_ts: int) -> UpdateDecision:
        """Lines 13-14: divide the sum by d, scale the learning rate by d, advance t."""
        d = len(self.pending)
        self.c_time = None
        self.rounds.closed(server_ts)
        return close_round(self, server_ts, divisor=d, lr_scale=float(d))

    def describe(self) -> str:
        return f"psp partial push (c={self.c} of {self.n_learners}, tau1={self.tau1:g}s)"
