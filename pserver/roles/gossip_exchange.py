"""ADPSGD's learner exchange for the trainer (``pserver.roles.trainer``): one learner's
:class:`~pserver.roles.gossip.Gossip` (the bytes of the ring exchanges), its local update rule
and its part in the epoch averages (``pserver.roles.gossip_model``)."""

from __future__ import annotations

from typing import Any

from pserver.roles.exchange import Exchange, LearnerSide
from pserver.roles.gossip import Gossip


class GossipExchange(Exchange):
    """The trainer's exchange for ``protocol.name = "adpsgd"`` (``pserver.roles.trainer``):
    ``weights()`` is a snapshot of the learner's model, ``gradient(g)`` the local update
    (the parameter-server path's rule, schedule and weight decay, applied here) followed by
    the exchange, ``finish()`` the goodbyes, then the average model for the statistics server
    (``pserver.roles.gossip_model``); ``state()`` / ``restore()`` its checkpoint
    (``pserver.ckpt.drivers.gossip``). A lost learner (issue 22): the gossip breaks and
    repairs its ring (``pserver.roles.gossip``), the averages follow (``on_repair``)."""

    freeze_after_weights = False
    relayed_bytes = 0  # weights forwarded for others: none (an exchange is one's own model)

    def __init__(self, side: LearnerSide, weights: Any) -> None:
        from pserver.comm.backend import StagingBuffers
        from pserver.comm.payload import staged
        from pserver.optim.local_update import LocalUpdate
        from pserver.roles.gossip_model import GossipModel

        cfg, xp = side.cfg, side.xp
        if side.learner_comm is None:
            raise RuntimeError("ADPSGD needs the learners' communicator")
        self.waiter = side.waiter()
        self.grad = xp.empty_like(weights)
        self.have: dict[int, int] = {}
        self.records: Any = None
        # scale 1: one's own gradient
        self.rule = rule = LocalUpdate(cfg.optim, weights.size, xp, weights.dtype)
        self.backend = side.backend
        self.side = side
        batch, n_train = cfg.data.batch_size, side.train_size

        def apply(w: Any, g: Any, step: int) -> None:
            # the epoch of this learner's step: λ learners at its pace took step·λ minibatches
            # (pserver.protocols.ring.local_epoch; λ′ a step after a loss: minibatches())
            rule.step(w, g, self.average.minibatches(step) * batch / n_train)

        stage = None
        if staged(side.backend, cfg.comm.staging):
            stage = StagingBuffers(side.backend, [weights.size] * 2, weights.dtype)
        self.gossip = Gossip(
            side.learner_comm, xp, self.waiter, weights, apply,
            threaded=True, stage=stage, synchronize=side.backend.synchronize,  # every comm.mode
            now=side.now, activate=side.backend.activate,
            start=not side.resumed,  # resumed: once restored (restore())
        )  # fmt: skip
        self.average = GossipModel(side, weights, self.gossip.lock)
        g, avg = self.gossip, self.average
        avg.broken, avg.check, avg.fail = (lambda: g.broken), g.check, g.fail
        g.on_break.append(avg.revoke)
        g.on_repair.extend([avg.repaired, self.repaired])

    def repaired(self, comm: Any) -> None:
        """The learners' communicator is now the survivors' (freed at the end, job.cli)."""
        self.side.learners.replace(comm)

    def attach(self, records: Any) -> None:
        """Where the ``exchanges`` rows go (the trainer's record buffer)."""
        self.records = records

    def weights(self) -> Any:
        return self.gossip.snapshot()

    def gradient_buffer(self) -> Any:
        return self.grad

    def gradient(self, g: Any) -> None:
        self.gossip.update(g)
        self.have[0] = steps = self.gossip.clock.own
        tested = self.average.stepped(self.gossip.w, steps)
        self.flush_rows()
        if tested and self.records is not None:  # the epoch's rows before its average model:
            self.records.send()  # the statistics server's progress line then counts them

    def staleness(self) -> tuple[float, int]:
        return 0.0, 0

    def done(self) -> float:
        return self.gossip.wait_exchange()

    def close(self) -> None:
        self.gossip.close()

    def finish(self) -> None:
        while True:  # again after a lost learner broke the ring under the averages
            self.gossip.finish()  # goodbyes first: the final average is then the models' mean
            self.flush_rows()
            if self.average.finish(self.gossip.w, self.gossip.clock.own):
                return

    def signalled(self) -> None:
        """The trainer stopped at a signal: ``finish`` cuts the epoch averages for a resume."""
        self.average.stopped = True

    def state(self) -> Any:
        from pserver.ckpt.drivers.gossip import exchange_state

        return exchange_state(self)

    def restore(self, state: Any) -> None:
        """The checkpoint's model, rule state and clock, then the engine starts answering."""
        from pserver.ckpt.drivers.gossip import restore_exchange

        restore_exchange(self, state)
        self.gossip.engine.start()

    def flush_rows(self) -> None:
        rows, sigma = self.gossip.take_rows(), self.gossip.take_staleness()
        if self.records is not None:
            for row in rows:
                self.records.add("exchanges", **row)
            for row in sigma:
                self.records.add("staleness", **row)
