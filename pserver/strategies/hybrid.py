"""HYBRID (IBM, Zhang et al., §3, Fig. 3): SYNC with the allreduce of step k running in the
communication thread while step k+1's gradient is computed, so every gradient is applied one
step late (staleness 1). The allreduce runs in a communication thread in every ``comm.mode``,
which needs MPI_THREAD_MULTIPLE (``pserver.runtime.context.check_exchange_thread``)."""

from __future__ import annotations

from pserver.strategies import collective as c
from pserver.strategies.base import COLLECTIVE, Strategy

HYBRID = Strategy(
    name="hybrid",
    family=COLLECTIVE,
    summary="SYNC's allreduce overlapped with the next gradient: staleness 1 (IBM HYBRID)",
    protocol=None,
    shared=c.LOCKSTEP_SHARED,
    ranks=c.RANKS,
    exchanges={m: c.ALLREDUCE_DELAYED for m in ("blocking", "nonblocking", "thread")},
    checks=(*c.CHECKS, c.check_lockstep_lr_policy),
    lockstep=True,
    survives_lost_learner=True,  # the learners regroup (pserver.roles.hybrid)
)
