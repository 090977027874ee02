"""A shard block under BMUF or MA (Chen & Huo): the master's side of a block round. Pure.

The round is hardsync's (:class:`pserver.protocols.block.BlockRound`): it closes once every
learner's local model of block t is in, and the accumulator then holds their sum. :meth:`apply`
divides by λ (W̄(t)) and runs block momentum (:mod:`pserver.optim.block_momentum`, eqs. 3–4) on
``w``, which is W(t) alone: the buffers pulls read are apart from it, and :meth:`serve` writes
W_g(t) there (eq. 5 or 6). The statistics server's snapshots read ``w``: the tests see W(t),
never the look-ahead.

A "gradient" here is a local model worth τ minibatches, so the epochs count ``applied · τ ·
batch`` samples.

A lost learner (Open MPI's ULFM, issue 22): the shard calls the round's ``lose``
(:meth:`pserver.protocols.block.BlockRound.lose`), so the round closes with the λ − 1 deltas
left, and W̄(t) of eq. (2) is their mean (the divisor is the deltas in the round; a delta the
dead learner had sent whole before it died stays in its round, one it left half sent never
entered it: the shard discards it, ``pserver.roles.server``). Where η is eq. (10)'s default,
η = 1 − 1/λ, the next :meth:`apply` recomputes it with the new λ (:meth:`follow`), keeping
the filter's total gain ζ / (λ(1 − η)) = C = 1 of eq. (10); an η the config set stays.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pserver.optim.block_momentum import BlockMomentum, Filter, default_block_momentum
from pserver.plan.config import Config, OptimConfig
from pserver.protocols import make_protocol
from pserver.protocols.base import Protocol, UpdateDecision
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.shard_block import Applied, ShardBlock
from pserver.strategies.base import BLOCK_MOMENTUM
from pserver.strategies.bmuf import AUTO

if TYPE_CHECKING:
    from pserver.strategies.serving import Serving


def block_filter(cfg: Config, n_learners: int) -> Filter:
    """τ, η, ζ and the served model of ``cfg`` with λ = ``n_learners`` learners."""
    p = cfg.protocol
    if p.name == "ma":
        return Filter(p.tau, 0.0, 1.0, nesterov=False)
    eta = default_block_momentum(n_learners) if p.block_momentum == AUTO else p.block_momentum
    return Filter(p.tau, eta, p.block_lr, p.nesterov)


class BlockMomentumShard(ShardBlock):
    """W(t), Δ(t) and the round of one block; ``served`` is the version pulls read first."""

    def __init__(
        self,
        w: Any,
        protocol: Protocol,
        rule: BlockMomentum,
        optim: OptimConfig,
        epochs: EpochCounter,
        xp: Any,
    ) -> None:
        super().__init__(w, protocol, rule, optim, epochs, xp)
        self.rule = rule
        self.first_served = w  # the first version pulls read (W_g(0) = w0)
        self.w = xp.array(w, copy=True)  # W(t), ours alone; ``w`` stays the first served version
        self.n_learners = protocol.n_learners  # λ the filter was made for
        self.auto_eta = False  # η is eq. (10)'s 1 − 1/λ (build: protocol.block_momentum = -1)

    @classmethod
    def build(
        cls, w: Any, cfg: Config, n_learners: int, train_size: int, xp: Any,
        mode: Serving | None = None,
    ) -> BlockMomentumShard:  # fmt: skip
        """BMUF's master block (no layer runs over BMUF: ``mode`` only says so)."""
        flt = block_filter(cfg, n_learners)
        epochs = EpochCounter(
            train_size, cfg.data.batch_size * flt.tau, cfg.run.epochs, cfg.stats.test_every,
            cfg.run.epoch_basis,
        )  # fmt: skip
        rule = BlockMomentum(flt, w.size, xp, w.dtype)
        shard = cls(w, make_protocol(cfg, n_learners), rule, cfg.optim, epochs, xp)
        shard.auto_eta = cfg.protocol.name == "bmuf" and cfg.protocol.block_momentum == AUTO
        return shard

    def follow(self, n_learners: int) -> None:
        """λ is now ``n_learners`` (learners were lost): η = 1 − 1/λ again where it is eq.
        (10)'s default, so that the filter's gain ζ / (λ(1 − η)) stays C = 1; Δ(t) is kept
        (the momentum of the blocks so far is the survivors' as much as the dead one's)."""
        self.n_learners = n_learners
        if self.auto_eta and n_learners > 0:
            f = self.rule.filter
            self.rule.filter = replace(f, eta=default_block_momentum(n_learners))
            if self.rule.filter.looks_ahead and self.rule.ahead is None:
                self.rule.ahead = self.xp.empty_like(self.w)

    def apply(self, decision: UpdateDecision, into: Any = None, source: Any = None) -> Applied:
        """W̄(t) = the mean local model, then eqs. (2)–(4) on W; W_g(t) into ``into`` (whose
        contents it replaces whole: ``source``, the current weights, is not needed)."""
        g = self.accum if self.held is None else self.held
        if self.protocol.n_learners != self.n_learners:  # a learner was lost (issue 22)
            self.follow(self.protocol.n_learners)
        if decision.divisor != 1.0:
            self.xp.multiply(g, 1.0 / decision.divisor, out=g)
        norms = self.rule.step(self.w, g)
        if into is not None:
            self.serve(into)
        self.ts, self.in_round, self.held = decision.new_timestamp, 0, None
        self.applied += len(decision.vector_clock)
        f = self.rule.filter
        row = dict(
            round=self.ts, tau=f.tau, eta=f.eta, zeta=f.zeta, g_norm=norms.g,
            delta_norm=norms.delta, learners=len(decision.learners),
            local_steps=f.tau * len(decision.learners),
        )  # fmt: skip
        return Applied(decision, f.zeta, rows=(("rounds", row),))

    @property
    def fuses_copy(self) -> bool:
        """``apply`` writes W_g(t) whole into a new version: it never needs the copy."""
        return True

    def serve(self, out: Any = None) -> Any:
        """W_g(t): W(t) + η·Δ(t) for NBM (eq. 6), W(t) for CBM and MA (eq. 5)."""
        return self.rule.served(self.w, out)

    def restored(self) -> None:
        """Resumed (``pserver.ckpt.records.shard.restore_block``: W(t) and Δ(t) are in): the first
        version pulls read becomes W_g(t), eq. 5 or 6, instead of w0."""
        self.serve(self.first_served)


#: ``Strategy.shard_block`` -> the block's arithmetic (the real shard's and the simulated one's).
SHARD_BLOCKS: dict[str, type[ShardBlock]] = {"": ShardBlock, BLOCK_MOMENTUM: BlockMomentumShard}
