"""A learner's own copy of the update rule: the parameter-server path's step, applied locally.

The learners-only strategies (SYNC, HYBRID, ADPSGD; BMUF's local steps too) keep the model on
every learner and update it there, with the same rules, schedules and weight decay as a shard
(``pserver.optim.make_updater``, ``scheduled_lr``): w ← step(w, Σg / divisor, α(epoch) · scale).
``divisor`` is how many gradients were summed (λ after an allreduce of gradients, 1 for a
learner's own), ``scale`` the strategy's learning-rate factor (SYNC and HYBRID: hardsync's
√(λμ/B), Rudra §III-B, so that the two families are comparable on one config).

With λ = 1, divisor 1 and scale 1 this is exactly the serial reference's step
(``learners.serial.train_serial``): same updater, same rate, same operations.

Pure: no MPI; arrays of any backend (``xp``).
"""

from __future__ import annotations

import math
from typing import Any

from pserver.config import Config
from pserver.optim import make_updater, scheduled_lr


def lr_scale(cfg: Config, n_learners: int) -> float:
    """√(λμ/B) with B = μ: hardsync's factor at its default ``protocol.ref_batch = 0``
    (a key of hardsync alone), so that SYNC and hardsync run one rule on one config."""
    batch = cfg.data.batch_size
    return math.sqrt(n_learners * batch / batch)


class LocalUpdate:
    """One learner's updater over its whole flat model (one block: the learner owns it all)."""

    def __init__(self, cfg: Config, size: int, xp: Any, dtype: Any, scale: float = 1.0) -> None:
        self.optim, self.xp, self.scale = cfg.optim, xp, scale
        self.updater = make_updater(cfg.optim, size, xp, dtype)
        self.lr = 0.0  # the rate of the last step (for the ``updates`` row)

    def step(self, w: Any, g: Any, epoch: int, divisor: float = 1.0) -> None:
        """Update ``w`` in place from the sum ``g`` of ``divisor`` gradients (``g`` may be
        scaled in place) at the rate of (0-based) ``epoch``."""
        if divisor != 1.0:
            self.xp.multiply(g, 1.0 / divisor, out=g)
        self.lr = scheduled_lr(self.optim, epoch) * self.scale
        self.updater.step(w, g, self.lr)
