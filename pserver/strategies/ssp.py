"""ssp (stale synchronous parallel): asynchronous updates, but a learner more than s clocks
ahead of the slowest has its pull held until that one catches up."""

from __future__ import annotations

from pserver.protocols.ssp import StaleSynchronous
from pserver.strategies import parameter_server as ps
from pserver.strategies.base import PARAMETER_SERVER, PS, Config, Param, Strategy


def protocol(cfg: Config, n_learners: int) -> StaleSynchronous:
    return StaleSynchronous(n_learners, cfg.protocol.s, ps.lr_policy(cfg))


SSP = Strategy(
    name="ssp",
    family=PARAMETER_SERVER,
    summary="async updates, a learner at most s clocks ahead of the slowest (SSP)",
    protocol=protocol,
    params=(Param("s", int, 3, ">= 0", help="clocks a learner may run ahead of the slowest"),),
    shared=ps.SHARED,
    layered=ps.LAYERED,
    # the shard holds a pull past the bound: an overlapped learner would compute on regardless
    exchanges={"blocking": PS},
    checks=ps.CHECKS,
)
