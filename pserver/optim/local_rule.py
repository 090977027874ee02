"""A learner's own update rule for local steps (BMUF's intra-block optimization), pure.

Under ``protocol.name = "bmuf"`` or ``"ma"`` each learner starts block ``t`` from the global
model W_g(t−1) and runs τ minibatch steps on its whole weight vector with ``optim.rule``
(:func:`pserver.optim.rules.make_updater`), then pushes w − W_g(t−1) (Chen & Huo §2.1.2: "update
these local models by each worker independently with 1-sweep mini-batch SGD with classical
momentum trick").

**The optimizer state is reset at each block start**: the velocity (momentum, nesterov) or the
sum of squares (adagrad) starts at zero from the new global model, as a fresh local model does
in the paper; the history across blocks is the master's block momentum Δ.

The learning rate is ``optim``'s schedule (:func:`pserver.optim.rules.scheduled_lr`) at the
(fractional) epoch the block starts at, counted as the shard counts it: ``t`` blocks of λ·τ
minibatches each. A whole block runs at one rate, so a λ = 1, τ = 1 run steps exactly as serial
SGD does.
"""

from __future__ import annotations

from typing import Any

from pserver.optim.local_update import LocalUpdate
from pserver.optim.rules import scheduled_lr
from pserver.plan.config import OptimConfig


def block_epoch(block: int, n_learners: int, tau: int, batch_size: int, train_size: int) -> int:
    """The (0-based) epoch in which block ``block`` (0-based) starts: the samples of the
    ``block`` rounds before it, λ·τ minibatches each, over the epoch's samples."""
    return block * n_learners * tau * batch_size // train_size


def block_position(
    block: int, n_learners: int, tau: int, batch_size: int, train_size: int
) -> float:
    """Where block ``block`` starts in fractional epochs (:func:`block_epoch` without the floor):
    the schedule's point, whose warm-up moves within an epoch."""
    return block * n_learners * tau * batch_size / train_size


class LocalRule:
    """``optim.rule`` on one learner's whole weight vector (a ``LocalUpdate``), restarted at every
    block."""

    def __init__(
        self,
        optim: OptimConfig,
        size: int,
        xp: Any,
        dtype: Any,
        blocks_per: tuple[int, int, int, int],
    ) -> None:
        """``blocks_per``: (λ, τ, batch size, training samples), for the epoch of a block."""
        self.local = LocalUpdate(optim, size, xp, dtype)
        self.blocks_per = blocks_per
        self.epoch = 0.0

    @property
    def updater(self) -> Any:
        return self.local.updater

    @property
    def lr(self) -> float:
        """The rate the block's steps take (the schedule at the block's first epoch)."""
        return scheduled_lr(self.local.optim, self.epoch)

    def start(self, block: int) -> None:
        """Block ``block`` begins: zero the optimizer state, take the block's learning rate."""
        self.local.reset()
        self.epoch = block_position(block, *self.blocks_per)

    def step(self, w: Any, g: Any) -> None:
        """One local step, in place; ``g`` is clobbered."""
        self.local.step(w, g, self.epoch)
