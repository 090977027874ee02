"""ssp (stale synchronous parallel): asynchronous updates, but a learner more than s clocks
ahead of the slowest has its pull held until that one catches up."""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.protocols.ssp import StaleSynchronous
from pserver.strategies import parameter_server as ps
from pserver.strategies.base import PARAMETER_SERVER, PS, Config, Param, Strategy


def protocol(cfg: Config, n_learners: int) -> StaleSynchronous:
    # auto: the measured ⟨σ⟩ rule; SSP has no n for eq. (6)'s α0/n, and its own paper (Ho et
    # al.) is none of the five this framework follows (docs/protocols.md, *Deviations*)
    return StaleSynchronous(n_learners, cfg.protocol.s, ps.lr_policy(cfg, auto="mean"))


def check_lr_policy(s: Strategy, cfg: Config) -> None:
    """``nominal`` is α0/n of n-softsync (Rudra eq. 6); SSP's staleness has no such n."""
    if cfg.protocol.lr_policy == "nominal":
        raise ConfigError(
            'protocol.lr_policy = "nominal" divides α0 by the n of n-softsync (Rudra eq. 6), '
            'which ssp does not have; use "mean" (measured ⟨σ⟩), "per-gradient" or "none"'
        )


SSP = Strategy(
    name="ssp",
    family=PARAMETER_SERVER,
    summary="async updates, a learner at most s clocks ahead of the slowest (SSP)",
    protocol=protocol,
    params=(Param("s", int, 3, ">= 0", help="clocks a learner may run ahead of the slowest"),),
    shared=ps.SHARED,
    layers=ps.LAYERS,
    # the shard holds a pull past the bound: an overlapped learner would compute on regardless
    exchanges={"blocking": PS},
    checks=(*ps.CHECKS, check_lr_policy),
    survives_lost_learner=True,
)
