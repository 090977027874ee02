"""When a learners-only run ends, and which step ends which epoch: pure decisions.

A learners-only strategy (SYNC, HYBRID, ADPSGD: the IBM paper's §3) has no shard to count
the samples, so the count is of **minibatches**: the run consumes
``M = ⌈run.epochs · train_size / data.batch_size⌉`` of them, as many as the serial reference
(``learners.serial.serial_steps``) and a single-learner parameter-server run.

Lockstep strategies (SYNC, HYBRID) must stop every learner at the **same step index**: an
allreduce that one learner no longer joins never completes. So nothing that differs between
learners (arrival order at the data server, prefetching) may decide it: every learner takes
``S = ⌈M / λ⌉`` steps (:meth:`RunPlan.last`), a function of the config and λ alone, and step
``k`` completes the global minibatch count ``(k + 1) · λ``, which decides the epoch ends
(:meth:`RunPlan.ends`, through the shards' ``EpochCounter``) identically on every learner.

The data server serves what the plan needs and answers later requests with a stop
(:class:`DataQuota`): each lockstep learner gets exactly ``S`` minibatches (so a learner that
prefetched ahead cannot starve a slower one of its last), a free-running learner (ADPSGD) gets
minibatches while the global count is below ``M``.

Pure: no MPI, no arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pserver.plan.config import Config
from pserver.protocols.epochs import EpochCounter, EpochEnds


def total_minibatches(cfg: Config, train_size: int) -> int:
    """M: the minibatches of ``run.epochs`` epochs (the serial reference's step count)."""
    return math.ceil(cfg.run.epochs * train_size / cfg.data.batch_size)


def lockstep_steps(total: int, n_learners: int) -> int:
    """S = ⌈M / λ⌉: the steps every learner of a lockstep run takes (S · λ ≥ M)."""
    if n_learners < 1:
        raise ValueError(f"a run needs at least one learner, not {n_learners}")
    return -(-total // n_learners)


@dataclass
class RunPlan:
    """One learner's view of a lockstep run: how many steps, the epoch of each step, and the
    epochs a step ends (the same on every learner: nothing here depends on the learner)."""

    counter: EpochCounter
    n_learners: int
    steps: int = field(init=False)

    def __post_init__(self) -> None:
        total = -(-self.counter.total_samples // self.counter.batch_size)
        self.steps = lockstep_steps(total, self.n_learners)

    @classmethod
    def from_config(cls, cfg: Config, train_size: int, n_learners: int) -> RunPlan:
        return cls(EpochCounter.from_config(cfg, train_size), n_learners)

    def last(self, step: int) -> bool:
        """Whether ``step`` (0-based) is the last one."""
        return step + 1 >= self.steps

    def epoch(self, step: int) -> float:
        """The (0-based, fractional) epoch the gradients of ``step`` are at (the lr schedule's):
        the global minibatches counted before it, ``step · λ``, as a shard counts applied ones."""
        return self.counter.position(step * self.n_learners)

    def ends(self, step: int) -> EpochEnds:
        """The epochs ended once ``step`` is applied, and those tested (call once per step,
        in order): the global count is then ``(step + 1) · λ`` minibatches."""
        return self.counter.advance((step + 1) * self.n_learners)  # S·λ ≥ M: the last is done


@dataclass
class ModelVersion:
    """A lockstep learner's model version (the averaged gradients applied to it) and the σ of
    each one it applies; the real learner (``pserver.roles.lockstep_model``) and the simulated
    one (``pserver.sim.collective``) keep it here."""

    value: int = 0

    def applied(self, computed_at: int) -> int:
        """σ of an averaged gradient computed on version ``computed_at`` (docs/stats.md,
        *Staleness σ*: the averaged updates applied since; SYNC 0, HYBRID 1, IBM Table 1),
        applied now: the version grows by one."""
        sigma = self.value - computed_at
        self.value += 1
        return sigma


LOCKSTEP = "lockstep"  # every learner takes S steps
FREE = "free"  # the global count stops at M, whoever takes them


@dataclass
class DataQuota:
    """The data server's decision: serve this request, or answer it with a stop."""

    kind: str  # LOCKSTEP | FREE
    total: int  # M
    n_learners: int
    served: dict[int, int] = field(default_factory=dict)  # learner index -> minibatches

    def __post_init__(self) -> None:
        if self.kind not in (LOCKSTEP, FREE):
            raise ValueError(f"quota kind {self.kind!r}: expected {LOCKSTEP!r} or {FREE!r}")

    @property
    def count(self) -> int:
        return sum(self.served.values())

    def allows(self, learner: int) -> bool:
        """Whether ``learner``'s next request gets a minibatch (counted when it does)."""
        if self.kind == LOCKSTEP:
            ok = self.served.get(learner, 0) < lockstep_steps(self.total, self.n_learners)
        else:
            ok = self.count < self.total
        if ok:
            self.served[learner] = self.served.get(learner, 0) + 1
        return ok


class LockstepDraws:
    """Which minibatch a lockstep learner gets: learner i's k-th is draw k·λ + i of the seeded
    stream (``draw()``), whatever order the requests arrive in. A lockstep run is then a
    function of the config and λ alone (every step sums draws kλ … kλ+λ-1, as one learner
    with a λ-times larger minibatch would), not of timing; with λ = 1 it is the serial
    stream. Draws taken ahead for a learner that has not asked yet wait here: at most
    (prefetch + 1) · λ of them, as no learner gets more than a step and its prefetch ahead."""

    def __init__(self, n_learners: int, draw: Callable[[], Any]) -> None:
        self.n_learners, self.draw = n_learners, draw
        self.pending: dict[int, Any] = {}
        self.drawn = 0

    def take(self, learner: int, k: int) -> Any:
        """The indices of ``learner``'s ``k``-th minibatch (0-based)."""
        want = k * self.n_learners + learner
        while self.drawn <= want:
            self.pending[self.drawn] = self.draw()
            self.drawn += 1
        return self.pending.pop(want)
