"""n-softsync and async (Rudra §III-A): a block updates after ⌊λ/n⌋ gradients of any age;
async is n = λ. The learning rate is α0/n by default, eq. (6) as published (α0/λ for async;
``protocol.lr_policy = "auto"`` or ``"nominal"``); ``"mean"`` divides by each update's
measured ⟨σ⟩ instead, ``"per-gradient"`` weights each gradient by 1/max(σ, 1)."""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.protocols.rudra import Softsync
from pserver.strategies import parameter_server as ps
from pserver.strategies.base import PARAMETER_SERVER, Config, Param, Strategy


def softsync_protocol(cfg: Config, n_learners: int) -> Softsync:
    n = cfg.protocol.n
    if n > n_learners:
        raise ConfigError(
            f"protocol.n = {n} exceeds the {n_learners} learners: n-softsync needs 1 <= n <= λ"
        )
    return Softsync(n_learners, n, ps.lr_policy(cfg))


def async_protocol(cfg: Config, n_learners: int) -> Softsync:
    return Softsync(n_learners, n_learners, ps.lr_policy(cfg))


SOFTSYNC = Strategy(
    name="softsync",
    family=PARAMETER_SERVER,
    summary="update after ⌊λ/n⌋ gradients of any age, lr α0/n (Rudra n-softsync, eq. 6)",
    protocol=softsync_protocol,
    params=(Param("n", int, 1, "> 0", help="update after ⌊λ/n⌋ gradients; 1 <= n <= λ"),),
    shared=ps.SHARED,
    layers=ps.LAYERS,
    exchanges=ps.EXCHANGES,
    tree=True,
    checks=ps.CHECKS,
    survives_lost_learner=True,
)

ASYNC = Strategy(
    name="async",
    family=PARAMETER_SERVER,
    summary="update after every gradient, lr α0/λ (Rudra async: softsync with n = λ, eq. 6)",
    protocol=async_protocol,
    shared=ps.SHARED,
    layers=ps.LAYERS,
    exchanges=ps.EXCHANGES,
    tree=True,
    checks=ps.CHECKS,
    survives_lost_learner=True,
)
