"""A learner's own copy of the update rule: the parameter-server path's step, applied locally.

The learners-only strategies (SYNC, HYBRID, ADPSGD; BMUF's local steps too) keep the model on
every learner and update it there, with the same rules, schedules and weight decay as a shard
(``pserver.optim.rules.make_updater``, ``scheduled_lr``): w ← step(w, Σg / divisor, α(epoch) ·
scale).
``divisor`` is how many gradients were summed (λ after an allreduce of gradients, 1 for a
learner's own), ``scale`` a strategy's learning-rate factor (1 for SYNC and HYBRID: IBM §3,
Fig. 3a, averages the λ learners' local updates W' = apply(W, g) at the learner's rate, which
is one step at α0 with the averaged gradient; hardsync with ``protocol.ref_batch = λμ`` runs
the same rule).

With λ = 1, divisor 1 and scale 1 this is exactly the serial reference's step
(``learners.serial.train_serial``): same updater, same rate, same operations.

Pure: no MPI; arrays of any backend (``xp``).
"""

from __future__ import annotations

from typing import Any

from pserver.optim.rules import make_updater, scheduled_lr
from pserver.plan.config import OptimConfig


class LocalUpdate:
    """One learner's updater over its whole flat model (one block: the learner owns it all)."""

    def __init__(
        self, optim: OptimConfig, size: int, xp: Any, dtype: Any, scale: float = 1.0
    ) -> None:
        self.optim, self.xp, self.scale = optim, xp, scale
        self.updater = make_updater(optim, size, xp, dtype)
        self.lr = 0.0  # the rate of the last step (for the ``updates`` row)

    def step(self, w: Any, g: Any, epoch: float, divisor: float = 1.0) -> None:
        """Update ``w`` in place from the sum ``g`` of ``divisor`` gradients (``g`` may be
        scaled in place) at the rate of (0-based, fractional) ``epoch``."""
        if divisor != 1.0:
            self.xp.multiply(g, 1.0 / divisor, out=g)
        self.lr = scheduled_lr(self.optim, epoch) * self.scale
        self.updater.step(w, g, self.lr)

    def reset(self) -> None:
        """Zero the optimizer state (velocity, sum of squares): a fresh start from new weights."""
        for state in self.updater.state_arrays().values():
            state.fill(0)
