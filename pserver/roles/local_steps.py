"""The learner's exchange under BMUF and MA: τ local steps, then one model push and one pull.

A composition around the blocking PS client (:class:`pserver.roles.learner.PSExchange`), which
moves the messages: at a block start ``weights()`` pulls the global model W_g(t−1) through it
(the first block starts on w0, as every rank builds it), copies it into the learner's own
compute buffer and restarts the local rule (:mod:`pserver.optim.local_rule`: optimizer state zeroed,
the block's learning rate). Each ``gradient(g)`` is a local step on that buffer; after the τ-th
the local model is copied into the PS client's gradient buffer and pushed with the timestamp of
W_g(t−1): the shard's round takes one model per learner computed from the block's global
model (σ = 0 by construction, recorded as the usual ``gradients`` rows) and forms the block's
update G(t) = W̄(t) − W_g(t−1) itself (eq. 2; :mod:`pserver.optim.block_momentum` says why the model
rather than the learner's delta w − W_g(t−1) travels: the same bytes, and MA is exactly W̄).

Liveness: a learner talks to the shards only at block boundaries, where it pushes every block
and then asks each for a model newer than its own; the shard's round closes once every
learner's delta is in (``pserver.protocols.block``), the block rule of
``pserver/protocols/rounds.py`` with full pulls, whose proof covers it. The shards stop only
after an update, when every learner is waiting in that pull, so every learner gets STOP there
and none is left mid-block. No arithmetic on parameters here beyond the local rule's step and
the copy of the local model into the message.
"""

from __future__ import annotations

from typing import Any

from pserver.ckpt.files import CheckpointError, State
from pserver.optim.local_rule import LocalRule
from pserver.roles.exchange import Exchange, LearnerSide
from pserver.roles.learner import PSExchange
from pserver.roles.stop_vote import stop_vote


class LocalStepsExchange(Exchange):
    """τ local steps between a pull of W_g and a push of the delta."""

    votes_on_stop = True  # every learner stops at the boundary its vote agrees on
    freeze_after_weights = False
    relayed_bytes = 0

    def __init__(self, side: LearnerSide, weights: Any) -> None:
        self.side, self.xp = side, side.xp
        self.ps = PSExchange(side, weights)
        self.waiter, self.have = self.ps.waiter, self.ps.have
        self.tau = side.cfg.protocol.tau
        self.w = self.xp.empty_like(self.ps.link.w)  # the local model
        self.g = self.xp.empty_like(self.w)  # the trainer's gradient buffer
        self.local = 0  # local steps done in this block
        lay, cfg = side.layout, side.cfg
        per = (len(lay.learners), self.tau, cfg.data.batch_size, side.train_size)
        self.rule = LocalRule(cfg.optim, self.w.size, self.xp, self.w.dtype, per)
        # the block at whose start a signal stops all
        self.vote = stop_vote(side.cfg, side.learner_comm, self.waiter)

    def weights(self) -> Any | None:
        if self.local == 0:  # a block starts from the global model
            start = self.ps.weights()
            if start is None:
                return None
            self.xp.copyto(self.w, start)
            self.rule.start(min(self.have.values()))
        return self.w

    def gradient_buffer(self) -> Any:
        return self.g

    def gradient(self, g: Any) -> None:
        self.rule.step(self.w, g)
        self.local += 1
        if self.local == self.tau:
            out = self.ps.gradient_buffer()
            self.xp.copyto(out, self.w)
            self.ps.gradient(out)
            self.local = 0

    def staleness(self) -> tuple[float, int]:
        return self.ps.staleness()

    def done(self) -> float:
        if self.vote is not None:
            self.vote.finish()  # the vote posted at the last block's start
        return self.ps.done()

    def close(self) -> None:
        self.ps.close()
        if self.vote is not None:
            self.vote.close()

    def finish(self) -> None:
        self.ps.finish()

    # -- checkpoints (pserver.ckpt.drivers.end) -------------------------------------------------

    def stop_agreed(self) -> bool:
        """Stop only at a block's start, every learner at the same block
        (``pserver.roles.stop_vote``): its delta of the block before is pushed and the round
        closes, so the shards hold W(t) and Δ(t) and no learner holds a local model, whose
        optimizer state restarts at every block anyway (``pserver.optim.local_rule``)."""
        if self.local != 0 or self.vote is None:
            return False
        return self.vote.boundary(True)  # the shards, not a plan, decide the last block

    def state(self) -> State:
        if self.local != 0:  # stop_agreed() stops at block starts only
            raise CheckpointError(f"a BMUF/MA learner stopped after {self.local} local steps")
        return self.ps.state()

    def restore(self, state: State) -> None:
        """Resume at a block's start: the first ``weights()`` pulls W_g(t) from the shards."""
        self.ps.restore(state)
        self.local = 0
