"""SYNC (IBM, Zhang et al., §3, Fig. 3a): every step, allreduce the learners' gradients and
apply their average on every learner at α0 (the average of the λ local steps W' = apply(W, g)
that the paper averages; hardsync with ``protocol.ref_batch = λμ`` runs the same rule)."""

from __future__ import annotations

from pserver.strategies import collective as c
from pserver.strategies.base import COLLECTIVE, Strategy

SYNC = Strategy(
    name="sync",
    family=COLLECTIVE,
    summary="allreduce every step's gradients, every learner applies their average (IBM SYNC)",
    protocol=None,
    shared=c.LOCKSTEP_SHARED,
    ranks=c.RANKS,
    exchanges={"blocking": c.ALLREDUCE, "nonblocking": c.ALLREDUCE, "thread": c.ALLREDUCE},
    waits_for_update=True,
    checks=(*c.CHECKS, c.check_lockstep_lr_policy),
    lockstep=True,
    survives_lost_learner=True,  # the learners regroup (pserver.roles.allreduce.Regroup)
)
