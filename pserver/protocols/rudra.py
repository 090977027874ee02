"""Rudra's hardsync and n-softsync protocols (Gupta et al., ICDM 2016, §III-A)."""

from __future__ import annotations

import math

from pserver.protocols.base import Arrival, GradientDecision, Protocol, UpdateDecision
from pserver.protocols.clocks import mean_staleness, staleness
from pserver.protocols.rounds import Rounds


class Hardsync(Protocol):
    """Eq. (3): every learner computes exactly one minibatch on the current weights.

    The update averages the λ gradients; the learning rate is multiplied by √(λμ/B), B being
    the reference batch size (§III-B). A gradient computed from older weights cannot occur when
    learners wait for each update (``waits_for_update``); if one arrives anyway it is dropped,
    so the recorded staleness of every applied gradient is 0.

    With partial pulling the pushes carry the learner's iteration (the rule of PSP-SGD's
    Algorithm 1, :mod:`pserver.protocols.rounds`): a gradient from a kept, older copy of this
    block is then accepted when its iteration has reached this round (σ > 0 is recorded), and
    the round closes once every learner has responded. The update averages the d gradients it
    took (d = λ whenever every learner's gradient of this round landed in it; a learner that
    ran ahead of this block may have answered it in an earlier round).
    """

    name = "hardsync"
    waits_for_update = True

    def __init__(self, n_learners: int, batch_size: int, ref_batch: int) -> None:
        super().__init__()
        self.n_learners = n_learners
        self.batch_size, self.ref_batch = batch_size, ref_batch
        self.lr_scale = math.sqrt(n_learners * batch_size / ref_batch)
        self.rounds = Rounds(n_learners, self.pending, "computed on superseded weights")

    def on_gradient(self, arrival: Arrival, server_ts: int) -> GradientDecision:
        return self.rounds.judge(arrival, server_ts)

    def ready(self, now: float | None = None) -> bool:
        return self.rounds.all_responded()

    def retire(self, learner: int) -> None:
        self.rounds.retire(learner)

    def lose(self, learner: int) -> None:
        """A lost learner: rounds of λ − 1 gradients, α0·√((λ − 1)μ/B) (§III-B with the new
        λ)."""
        if learner in self.rounds.lost:
            return
        self.rounds.lose(learner)
        self.n_learners -= 1
        self.lr_scale = math.sqrt(max(self.n_learners, 1) * self.batch_size / self.ref_batch)

    def commit(self, server_ts: int) -> UpdateDecision:
        d = len(self.pending)  # λ, except with partial pulling (see the class docstring)
        self.rounds.closed(server_ts)
        return close_round(self, server_ts, divisor=d, lr_scale=self.lr_scale)


class Softsync(Protocol):
    """Eq. (5): update after c = ⌊λ/n⌋ gradients of any age; n = λ is Async (eq. 4).

    ``lr_policy`` modulates the learning rate by staleness: ``nominal`` is eq. (6) as published,
    α = α0/⟨σ⟩ = α0/n, a constant (α0/λ for async, n = λ; Fig. 4 compares α0 with α0/n);
    ``mean`` divides it by each update's measured ⟨σ⟩ of eq. (2) (α0/max(⟨σ⟩, 1), never
    enlarging it when ⟨σ⟩ < 1); ``per-gradient`` scales each gradient by 1/max(σ, 1), the finer
    strategy of footnote 2; ``none`` keeps α0.
    """

    name = "softsync"

    def __init__(self, n_learners: int, n: int, lr_policy: str) -> None:
        super().__init__()
        if not 1 <= n <= n_learners:
            raise ValueError(f"n-softsync needs 1 <= n <= λ = {n_learners}, got n = {n}")
        self.n_learners = n_learners
        self.n = n
        self.count = n_learners // n
        self.lr_policy = lr_policy
        self.lost: set[int] = set()

    def on_gradient(self, arrival: Arrival, server_ts: int) -> GradientDecision:
        sigma = staleness(server_ts, arrival.timestamp)
        weight = 1.0 / max(sigma, 1) if self.lr_policy == "per-gradient" else 1.0
        self.pending.add(arrival)
        return GradientDecision(True, sigma, weight)

    def ready(self, now: float | None = None) -> bool:
        return len(self.pending) >= self.count

    def lose(self, learner: int) -> None:
        """A lost learner: eq. (5) for λ − 1. Async (n = λ) stays async, n = λ − 1; else n is
        kept while n <= λ − 1, and c = ⌊(λ − 1)/n⌋."""
        if learner in self.lost or self.n_learners <= 1:
            return
        self.lost.add(learner)
        was_async = self.n == self.n_learners
        self.n_learners -= 1
        self.n = self.n_learners if was_async else min(self.n, self.n_learners)
        self.count = self.n_learners // self.n
        self.retire(learner)

    def commit(self, server_ts: int) -> UpdateDecision:
        scale = self.lr_scale(server_ts)
        return close_round(self, server_ts, divisor=len(self.pending), lr_scale=scale)

    def lr_scale(self, server_ts: int) -> float:
        """The factor on α0 of this update (eq. 6), before :func:`close_round` clears the clock."""
        if self.lr_policy == "nominal":
            return 1.0 / self.n  # eq. (6) as published: α0/n, whatever σ was measured
        if self.lr_policy == "mean":
            mean = mean_staleness(server_ts + 1, self.pending.clock)
            return 1.0 / max(mean, 1.0)
        return 1.0

    def describe(self) -> str:
        return f"{self.n}-softsync (c={self.count}, lr {self.lr_policy})"


def close_round(proto: Protocol, server_ts: int, divisor: float, lr_scale: float) -> UpdateDecision:
    clock, learners = tuple(proto.pending.clock), tuple(proto.pending.learners)
    proto.pending.clock.clear()
    proto.pending.learners.clear()
    return UpdateDecision(
        new_timestamp=server_ts + 1,
        vector_clock=clock,
        learners=learners,
        mean_staleness=mean_staleness(server_ts + 1, clock),
        divisor=float(divisor),
        lr_scale=lr_scale,
    )
