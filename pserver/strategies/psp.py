"""psp (PSP-SGD Algorithm 1, server part): partial pushing, a block updates after the first
c fresh gradients (plus τ1 seconds), drops stale ones and scales the rate by the count d."""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.protocols.psp import PartialPush
from pserver.strategies import parameter_server as ps
from pserver.strategies.base import PARAMETER_SERVER, Config, Param, Strategy


def protocol(cfg: Config, n_learners: int) -> PartialPush:
    c = cfg.protocol.c or n_learners
    if c > n_learners:
        raise ConfigError(
            f"protocol.c = {c} exceeds the {n_learners} learners: partial pushing needs "
            "1 <= c <= λ (0 means λ)"
        )
    return PartialPush(n_learners, c, cfg.protocol.tau1)


PSP = Strategy(
    name="psp",
    family=PARAMETER_SERVER,
    summary="partial pushing: update after the first c fresh gradients (+τ1) (PSP-SGD)",
    protocol=protocol,
    params=(
        Param("c", int, 0, ">= 0", help="gradients a block waits for; 0: λ"),
        Param("tau1", float, 0.0, ">= 0", help="seconds to accept more after the c-th"),
    ),
    shared=ps.SHARED,
    layers=ps.LAYERS,
    exchanges=ps.EXCHANGES,
    waits_for_update=True,
    checks=(*ps.CHECKS, ps.check_round_lr_policy),
    survives_lost_learner=True,
)
