"""ADPSGD (IBM paper §3, Fig. 3b, Fig. 4): learners only; after each local update a learner
averages its model with a ring neighbour's, w ← (w + w')/2 (eq. 4). The ring schedule and its
liveness argument: ``pserver.protocols.ring``; the exchange: ``pserver.roles.gossip`` (the bytes)
and
``pserver.roles.gossip_exchange`` (the trainer's exchange)."""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.strategies import collective as c
from pserver.strategies.base import COLLECTIVE, Config, Strategy

GOSSIP = c.GOSSIP  # the learner exchange (pserver.job.cli's EXCHANGES)


def check_lr_policy(s: Strategy, cfg: Config) -> None:
    """A learner applies its own gradient at α0: there is no staleness to modulate by."""
    policy = cfg.protocol.lr_policy
    if policy not in ("auto", "none"):
        raise ConfigError(
            f"protocol.lr_policy = {policy!r} does not apply to adpsgd (each learner applies "
            'its own gradient at optim.lr, then averages with a neighbour); use "auto" or "none"'
        )


ADPSGD = Strategy(
    name="adpsgd",
    family=COLLECTIVE,
    summary="local update, then w ← (w + w')/2 with a ring neighbour (IBM ADPSGD)",
    protocol=None,
    # lr_policy "auto" | "none" (each learner applies its own gradient at α0), so that a
    # parameter-server config switches by protocol.name alone, as to SYNC
    shared=c.LOCKSTEP_SHARED,
    ranks=c.RANKS,
    # every mode runs the paper's communication thread (a receiver answers while it
    # computes; without it a receiver answers between minibatches only and its senders wait
    # for its compute), so it needs MPI_THREAD_MULTIPLE, as HYBRID (collective.THREADED)
    exchanges={"blocking": GOSSIP, "nonblocking": GOSSIP, "thread": GOSSIP},
    checks=(*c.CHECKS, check_lr_policy),
    min_learners=2,
    # it checkpoints at its end and on SIGTERM (each learner at its own step boundary, its
    # exchanges completed with goodbyes, pserver.ckpt.drivers.gossip), but no vote stops all
    pauses=False,
    why_no_pause="its learners run free and pause at no common point",
    # issue 22: the survivors shrink the learners' communicator and go on in the ring of λ − 1
    # (pserver.protocols.ring.Ring.lose, pserver.roles.gossip)
    survives_lost_learner=True,
)
