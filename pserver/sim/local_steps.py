"""A simulated BMUF or MA learner (Chen & Huo; the real exchange ``pserver.roles.local_steps``).

``LocalStepsExchange`` runs ``protocol.tau`` local steps between a pull of the global model and
a push of its local model; the shard's block round (``pserver.protocols.block.BlockRound``) and
its block momentum (``pserver.protocols.bmuf_block.BlockMomentumShard``, chosen by the real
shard's ``SHARD_BLOCKS``) are the simulated shard's, as for every parameter-server strategy
(``pserver.sim.shard``). Here a learner's step is the blocking learner's
(``pserver.sim.learner.SimLearner``) only at a block's τ-th minibatch (push, then the pull of
the next block's model, judged by its own ``PullRule``); the other local steps compute, write
their ``train`` row and take the next minibatch without a message (the first block runs on w0,
as every rank builds it).
"""

from __future__ import annotations

from typing import Any

from pserver.sim.learner import NAN, SimLearner


class LocalStepsLearner(SimLearner):
    """A blocking learner that talks to the shard once per ``tau`` minibatches."""

    __slots__ = ("tau", "local")

    def __init__(self, *args: Any, tau: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.tau = tau
        self.local = 0  # local steps done in this block

    def computed(self, pull: float, fetch: float) -> None:
        self.local += 1
        if self.local == self.tau:  # LocalStepsExchange.gradient: the block's push and pull
            self.local = 0
            super().computed(pull, fetch)
            return
        now = self.loop.now
        c = self.compute_now
        self.compute_time += c
        self.pull_time += pull
        self.train.append((self.index, self.steps, now, NAN, NAN, c, pull + fetch, pull, 0.0,
                           self.partial.stale_fraction, self.partial.dropped))  # fmt: skip
        if self.train.full():
            self.rows.write(self.train)
        freeze = self.costs.plan.freeze_for(self.index, self.steps) if self.freezes else 0.0
        self.steps += 1
        self.loop.after(freeze + self.costs.sim.step_overhead, self.compute, 0.0)
