"""The round of BMUF and MA (Chen & Huo): one model delta from every learner per block.

Hardsync's round (:class:`pserver.protocols.rudra.Hardsync`, the block rule of
:mod:`pserver.protocols.rounds`): a delta is accepted iff it was computed from the block's
current global model (σ = 0, at most one per learner), the round closes once all λ are in, and
the update averages them (divisor λ: G(t), eq. 2). The learning rate is not scaled: the block
learning rate ζ is the master's (:mod:`pserver.optim.block_momentum`).
"""

from __future__ import annotations

from pserver.protocols.rudra import Hardsync


class BlockRound(Hardsync):
    name = "block round"

    def __init__(self, n_learners: int, tau: int) -> None:
        super().__init__(n_learners, batch_size=1, ref_batch=n_learners)  # √(λ·1/λ) = 1
        self.lr_scale = 1.0
        self.tau = tau

    def lose(self, learner: int) -> None:
        """A lost learner: the block average is over the λ − 1 deltas left, at the same rate."""
        super().lose(learner)
        self.lr_scale = 1.0

    def describe(self) -> str:
        return f"block round of {self.n_learners} deltas, tau = {self.tau} local steps"
