"""Round accounting of the protocols that wait for every learner (hardsync, PSP's partial push).

A block's round ``r`` is the interval in which its weights sit at timestamp ``r``. Every push
carries the timestamp ``have`` of the learner's copy of the block it was computed from (for σ
and the vector clocks, never estimated), and may carry the learner's **iteration tag** ``τ``:
PSP-SGD Algorithm 1, worker line 17, "Push each block with timestamp ⟨g_i, t⟩", t being the
worker's iteration rather than the block's own timestamp. Two rules decide what the round takes
(``protocol.pull_timestamp``, resolved by :func:`pserver.plan.config.pull_timestamp`):

* **block** (Rudra; no tag): a push answers round ``have``. It is accepted iff ``have == r``
  (σ = 0), at most one per learner, and "every learner has responded" means every learner's
  push was accepted. A learner asks each block for weights newer than its copy (``have + 1``).
* **iteration** (Algorithm 1; tag ``τ``): a push answers round ``τ``. It is accepted iff
  ``τ >= r`` (line 7: drop ``t' < t``) or ``have == r`` (computed on these very weights, which
  lets a learner that fell behind under ``c < λ`` count again), at most one per learner per
  round. A learner ``k`` **has responded** to round ``r`` once a push with ``τ >= r`` from it
  has arrived, in this round or an earlier one: ``latest[k] >= r``, ``latest[k]`` being the
  largest tag the block has seen from ``k``, whether the push was accepted or not. A learner
  at iteration ``W`` asks every block for weights ``>= W`` (worker lines 10-13) and, after its
  partial pull, tags its push ``τ = max(W, min over its live blocks of have)``; its next
  iteration is ``W' = τ + 1`` (:class:`pserver.protocols.partial_pull.PullRule`).

Under the block rule with partial pulling (b < 1), a gradient computed from a kept, older copy
of block ``j`` carries that copy's timestamp, is dropped as ``t' < t`` and never counts as the
learner's response, so block ``j`` waits for the learner while the learner waits for
⌈b·blocks⌉ fresh blocks that wait for the others: a cycle (issue 10, item 1). That combination
is refused before training (``pserver.plan.config.validate``). With b = 1 the two rules accept the
same gradients and close the same rounds.

Liveness of the iteration rule (any c, τ1, b, τ2, any finite reply delays)
-----------------------------------------------------------------------------

Assumptions, each kept by the drivers: (A1) a learner pushes every block that has not answered
STOP once per iteration, all with the same tag, and its tags strictly increase; pushes of one
learner reach one shard in order (MPI's non-overtaking rule on one communicator). (A2) The tag
is ``τ = W`` or, when larger, ``τ = min have <= have[j]`` for every block ``j`` pushed, and a
learner's copy is never newer than the block: ``have[j] <= ts_j`` at any later time. (A3) The
shard consults ``ready()`` after every arrival and at every deadline, and commits at once.
(A4) A held pull is answered when the block reaches the timestamp asked for, or with STOP once
the block is done; an answer older than the learner's current ``W`` is asked again; a STOP
takes the block out of the learner's iteration (:meth:`PartialPull.forget`). (A5) A learner
says BYE only after every block answered STOP, so no block still needs it.

*Invariant.* While round ``r`` is open, some learner has ``latest < r``; and the arrival that
makes every ``latest >= r`` closes round ``r`` with ``d >= 1``.

Round 0 opens with every ``latest = −1``. Suppose the invariant held for round ``r − 1``, and
look at the moment round ``r`` opens. If a timer (τ1) closed round ``r − 1``, some learner still
has ``latest < r − 1 < r``. If an arrival from learner ``k`` closed it, some learner ``m`` had
``latest_m < r − 1`` just before; only ``latest_k`` changed, so either ``m ≠ k`` still has
``latest_m < r``, or ``m = k`` and its tag went from ``<= r − 2`` to the new tag, which by (A2)
is the old tag plus one (``<= r − 1``) or at most ``have[j] <= ts_j = r − 1``. Either way some
learner has ``latest < r`` when round ``r`` opens. Within round ``r``, the arrival that makes
every ``latest >= r`` carries ``τ >= r``: it is accepted, or its sender was accepted earlier in
the round; so ``d >= 1``, ``ready()`` is true and by (A3) the round closes then. ("All
responded" thus never meets an empty round; ``ready()`` requires ``d >= 1`` all the same.)

*Training ends.* Every message is handled and every compute, delay and timer ends in finite
time, and between two iterations a learner sends finitely many messages (a push and at most a
few pulls per block: a pull is held, not answered, until it can be satisfied). Suppose training
never ended. Call a learner *stuck* if from some point on it never leaves its pull again.

If no learner is stuck, every learner's tags grow without bound, so for every block and every
``r``, every ``latest`` reaches ``r``: by the invariant every round closes, each with ``d >= 1``,
and every block reaches its applied-gradient target and is done; the learners get STOP from
every block and end. So some learner is stuck; let ``T`` be the smallest ``W`` of the stuck
learners and ``k0`` one at ``T``. Once the replies ``k0`` waits for have landed, every block
that is done has answered STOP and left ``k0``'s iteration, and every block with ``ts >= T``
has answered with weights ``>= T`` (A4); had all blocks been one or the other, ``k0`` would hold
every block it waits for and compute. So some block ``j`` stays below ``T`` and not done for
good, at some round ``r < T``. No learner says BYE meanwhile (A5). At ``j``, every stuck
learner ``k`` has pushed its last tag ``W_k − 1 >= T − 1 >= r`` (A1), and every other learner
pushes tags without bound: eventually every ``latest >= r``, and by the invariant round ``r``
closes, against ``j`` staying at ``r``. Hence training ends: no deadlock, and no learner or
block starved for ever either.
"""

from __future__ import annotations

from pserver.protocols.base import Arrival, GradientDecision, Pending
from pserver.protocols.clocks import staleness

SECOND = "second gradient in one round"


class Rounds:
    """One block's accepted gradients and responses in the current round, for ``n_learners``."""

    def __init__(self, n_learners: int, pending: Pending, stale_reason: str) -> None:
        self.n_learners = n_learners
        self.pending = pending
        self.stale_reason = stale_reason
        self.round = 0  # the block's timestamp, as the last arrival or commit told us
        self.latest: dict[int, int] = {}  # learner -> largest tag seen from it
        self.retired: set[int] = set()  # learners that said goodbye (stopped early: a signal)
        self.lost: set[int] = set()  # learners that died (ULFM): no longer among n_learners

    def judge(self, arrival: Arrival, server_ts: int) -> GradientDecision:
        """Accept the push into round ``server_ts`` or drop it, and note the response.

        Raises ValueError when ``arrival.timestamp > server_ts`` (a copy newer than the block
        cannot exist: a driver bug); the iteration tag itself may lie ahead of the block.
        """
        self.round = server_ts
        sigma = staleness(server_ts, arrival.timestamp)
        tag = arrival.timestamp if arrival.iteration is None else arrival.iteration
        k = arrival.learner
        self.latest[k] = max(self.latest.get(k, -1), tag)
        if sigma > 0 and tag < server_ts:
            return GradientDecision(False, sigma, reason=self.stale_reason)
        if k in self.pending.learners:
            return GradientDecision(False, sigma, reason=SECOND)
        self.pending.add(arrival)
        return GradientDecision(True, sigma)

    def all_responded(self) -> bool:
        """Every learner has answered this round (and at least one gradient is in it)."""
        # a lost learner's gradient taken before it died stays in the round, but does not
        # stand for a running learner's answer
        taken = sum(1 for k in self.pending.learners if k not in self.lost)
        if taken >= self.n_learners:
            return len(self.pending) > 0
        if self.retired and taken >= self.n_learners - len(self.retired):
            return len(self.pending) > 0  # the learners still running have all answered
        if not len(self.pending) or len(self.latest) < self.n_learners:
            return False
        return all(t >= self.round for t in self.latest.values())

    def retire(self, learner: int) -> None:
        """``learner`` computes no more: a round no longer waits for its gradient (a learner
        stopped by a signal while the others finish their step, ``pserver.runtime.signals``)."""
        self.retired.add(learner)

    def lose(self, learner: int) -> None:
        """``learner`` died: rounds wait for the ``n_learners − 1`` others from now on (its
        gradient already in this round stays in it)."""
        if learner in self.lost:
            return
        self.lost.add(learner)
        self.n_learners -= 1
        self.latest.pop(learner, None)
        self.retired.discard(learner)  # counted once: as lost

    def closed(self, server_ts: int) -> None:
        self.round = server_ts + 1
