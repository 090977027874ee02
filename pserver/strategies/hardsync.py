"""hardsync (Rudra §III-A): a block updates once every learner's gradient of the round is in."""

from __future__ import annotations

from pserver.protocols.rudra import Hardsync
from pserver.strategies import parameter_server as ps
from pserver.strategies.base import PARAMETER_SERVER, Config, Param, Strategy


def protocol(cfg: Config, n_learners: int) -> Hardsync:
    """α = α0·√(λμ/B) (Rudra §III-B), B = ``protocol.ref_batch`` or μ when 0."""
    batch = cfg.data.batch_size
    return Hardsync(n_learners, batch, cfg.protocol.ref_batch or batch)


HARDSYNC = Strategy(
    name="hardsync",
    family=PARAMETER_SERVER,
    summary="every learner's gradient of a round, then one update (Rudra hardsync)",
    protocol=protocol,
    params=(Param("ref_batch", int, 0, ">= 0", help="B of the factor √(λμ/B); 0: μ"),),
    shared=ps.SHARED,
    layers=ps.LAYERS,
    exchanges=ps.EXCHANGES,
    waits_for_update=True,
    tree=True,
    checks=(*ps.CHECKS, ps.check_round_lr_policy),
    survives_lost_learner=True,
)
