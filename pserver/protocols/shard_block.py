"""The arithmetic of one parameter block at a shard: w, the accumulator, the update rule, the
timestamp, the protocol round and the epoch count. Pure: no MPI; arrays of any backend (``xp``).

The server driver (``pserver.roles.server``) moves bytes: it receives a gradient into
``inbox()`` (or finds it in a shared-window slot), hands it to ``accept``, and when the protocol
says the round is complete (``ready``) it closes the round (``commit``) and passes the decision
to ``apply``, with the buffer the new weights go to when pulls still read the current one
(copy-on-write of ``pserver.protocols.versions``). ``serve`` is the model pulls receive: w itself
here,
the hook where another strategy produces a different model (a filtered or predicted one).

PP-ASGD (``protocol.predict``, ``pserver.optim.prediction``): ``serve`` writes the predicted weights
f_S(w, M) (Sato et al. eq. (2)) into the buffer it is given, never into ``w``; ``apply`` updates
the measured staleness S̄ and the S served next, and ends or starts an error probe (``Applied``).
The tests and the final model read ``w``.

Zero copy: the round's first gradient with weight 1 is not copied into the accumulator; it stays
``held`` where it arrived (``recv`` or the learner's shared slot), and a round of one gradient
(async, one learner) updates straight from there. A second gradient moves it out of ``recv``
(``inbox``); a shared slot is copied out (``keep``) before the learner may reuse it.

The update from timestamp t to t+1 (Rudra, Gupta et al. eqs. 3–6; hardsync and PSP-SGD are the
same shape): w ← step(w, (Σ_i weight_i · g_i) / divisor, α(epoch) · lr_scale), where the
protocol gives each gradient's weight (per-gradient learning-rate modulation, eq. 6), the
divisor and the scale, and α(epoch) is ``optim``'s schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pserver.optim.prediction import Predictor, ProbeResult
from pserver.optim.rules import make_updater, scheduled_lr
from pserver.plan.config import Config, OptimConfig
from pserver.protocols import make_protocol
from pserver.protocols.base import Arrival, GradientDecision, Protocol, UpdateDecision
from pserver.protocols.epochs import EpochCounter, EpochEnds

if TYPE_CHECKING:
    from pserver.strategies.serving import Serving


@dataclass(frozen=True)
class Accepted:
    """The protocol's decision on the gradient(s) of one push."""

    decisions: tuple[GradientDecision, ...]
    accepted: bool  # an aggregated sum is taken whole or not at all
    after_stop: bool = False  # training was over: dropped without asking the protocol


@dataclass(frozen=True)
class Applied:
    """What one update did (the ``updates`` row of the dump)."""

    decision: UpdateDecision
    lr: float  # the learning rate of the step: α(epoch) · lr_scale
    steps: int = -1  # PP-ASGD: the S the new weights are served with (-1: no prediction)
    probe: ProbeResult | None = None  # PP-ASGD: the error probe that ended at this update
    #: a strategy's own dump rows of this update, (group, columns) (BMUF's ``rounds``)
    rows: tuple[tuple[str, dict[str, Any]], ...] = ()


class ShardBlock:
    """One block's weights and the rule that updates them."""

    def __init__(
        self,
        w: Any,
        protocol: Protocol,
        updater: Any,
        optim: OptimConfig,
        epochs: EpochCounter,
        xp: Any,
    ) -> None:
        self.w, self.protocol, self.updater, self.optim, self.epochs, self.xp = (
            w, protocol, updater, optim, epochs, xp,
        )  # fmt: skip
        self.recv = xp.empty_like(w)  # where the driver receives a gradient
        self.accum = xp.zeros_like(w)  # aggregate of the round's accepted gradients
        self.held: Any = None  # the round's one gradient, where it arrived
        self.ts = 0
        self.applied = 0  # gradients that entered an update
        self.dropped = 0  # gradients the protocol refused
        self.in_round = 0  # gradients accumulated this round
        self.done = False
        self.predictor: Predictor | None = None  # PP-ASGD (``predicting``)
        self.predicted: Any = None  # where ``serve()`` writes the prediction without ``out``

    def predicting(self, fixed_steps: int, probe_every: int) -> None:
        """Serve f_S(w, M) from now on (``protocol.predict``; the rule has a velocity)."""
        o = self.optim
        self.predictor = Predictor(
            o.rule, o.momentum, fixed_steps, probe_every, self.w.size, self.xp
        )

    @property
    def velocity(self) -> Any:
        return self.updater.state_arrays()["velocity"]

    @classmethod
    def build(
        cls, w: Any, cfg: Config, n_learners: int, train_size: int, xp: Any,
        mode: Serving | None = None,
    ) -> ShardBlock:  # fmt: skip
        """The block of weights ``w`` under ``cfg``'s protocol, update rule and epochs; it
        predicts where the shard's serving mode ``mode`` says so (None: ``cfg``'s, from the
        registry: PP-ASGD's layer, ``pserver.strategies.serving``)."""
        if mode is None:
            from pserver.strategies.serving import serving  # the registry imports protocols

            mode = serving(cfg)
        block = cls(
            w,
            make_protocol(cfg, n_learners),
            make_updater(cfg.optim, w.size, xp, w.dtype),
            cfg.optim,
            EpochCounter.from_config(cfg, train_size),
            xp,
        )
        if mode.predicts:
            block.predicting(cfg.protocol.predict_steps, cfg.protocol.predict_probe)
        return block

    def inbox(self) -> Any:
        """The buffer to receive the next gradient in, after moving a held one out of it."""
        if self.held is self.recv and self.held is not None:
            self.recv, self.accum, self.held = self.accum, self.recv, None
        return self.recv

    def accept(
        self, entries: Sequence[tuple[int, int, int | None]], g: Any, now: float
    ) -> Accepted:
        """The protocol's decision on ``entries`` ((learner, timestamp, iteration) of each
        gradient summed in ``g``); an accepted ``g`` joins the round, a refused one is dropped."""
        if self.done:
            return Accepted((), False, after_stop=True)
        decisions = tuple(
            self.protocol.on_gradient(Arrival(lr, ts, now, it), self.ts) for lr, ts, it in entries
        )
        accepted = all(d.accept for d in decisions)
        if accepted:
            self.accumulate(decisions[0].weight, g)
        else:
            self.dropped += len(entries)
        return Accepted(decisions, accepted)

    def accumulate(self, weight: float, g: Any) -> None:
        xp = self.xp
        if self.in_round == 0:  # first of the round: overwrite instead of zero-then-add
            if weight == 1.0:
                self.held = g  # left where it arrived (see the module's zero copy)
            else:
                xp.multiply(g, weight, out=self.accum)
        elif weight == 1.0:
            xp.add(self.accum, g, out=self.accum)
        else:
            self.accum += weight * g
        self.in_round += 1

    def keep(self) -> None:
        """Copy a gradient held outside our buffers (a shared slot) into the accumulator."""
        if self.held is not None and self.held is not self.recv:
            self.xp.copyto(self.accum, self.held)
            self.held = None

    def ready(self, now: float) -> bool:
        """Whether the protocol's round is complete (or timed out: PSP's τ1)."""
        return self.protocol.ready(now)

    def commit(self) -> UpdateDecision:
        """Close the protocol's round."""
        return self.protocol.commit(self.ts)

    def apply(self, decision: UpdateDecision, into: Any = None, source: Any = None) -> Applied:
        """Divide, step at the scheduled rate, advance the timestamp.

        ``into``: the buffer the new weights are written to (a new version when pulls read the
        current); None writes ``w`` in place. It already holds the current weights, unless
        ``source`` is the buffer that does: then the step copies while it updates
        (``Updater.step_from``, one pass over memory), and ``source`` is left as it was.
        """
        # where these gradients are, in fractional epochs (a warm-up moves within an epoch)
        epoch = self.epochs.position(self.applied, self.dropped)
        lr = scheduled_lr(self.optim, epoch) * decision.lr_scale
        g = self.accum if self.held is None else self.held
        if decision.divisor != 1.0:
            self.xp.multiply(g, 1.0 / decision.divisor, out=g)
        if into is not None and source is not None:
            self.updater.step_from(into, source, g, lr)
            self.w = into
        else:
            if into is not None:
                self.w = into
            self.updater.step(self.w, g, lr)
        self.ts, self.in_round, self.held = decision.new_timestamp, 0, None
        self.applied += len(decision.vector_clock)
        if self.predictor is None:
            return Applied(decision, lr)
        probe = self.predictor.after_update(
            self.ts, decision.mean_staleness, lr, self.w, self.velocity
        )
        return Applied(decision, lr, self.predictor.steps, probe)

    @property
    def fuses_copy(self) -> bool:
        """Whether ``apply`` with a ``source`` copies while it steps, cheaper than a copy then
        the step (``Updater.fuses_copy``); the driver then leaves a copy-on-write to it."""
        return self.updater.fuses_copy

    def epoch_ends(self) -> EpochEnds:
        """The epochs ended by the gradients counted so far; marks the block done at the end."""
        ends = self.epochs.advance(self.applied, self.dropped)
        self.done = self.done or ends.done
        return ends

    def serve(self, out: Any = None) -> Any:
        """The model pulls receive: ``w`` (or a copy of it in ``out``). A strategy that serves
        another model (BMUF's filtered one, PP-ASGD's prediction) produces it here."""
        if self.predictor is not None:  # f_S(w, M) into out, or a buffer of our own
            if out is None:
                if self.predicted is None:
                    self.predicted = self.xp.empty_like(self.w)
                out = self.predicted
            return self.predictor.serve(self.w, self.velocity, out)
        if out is None:
            return self.w
        self.xp.copyto(out, self.w)
        return out
