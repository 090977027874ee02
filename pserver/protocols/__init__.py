"""Synchronization protocols: pure state machines, one instance per parameter block."""

from __future__ import annotations

from pserver.config import Config
from pserver.errors import ConfigError
from pserver.protocols.base import Arrival, GradientDecision, Protocol, UpdateDecision
from pserver.protocols.psp import PartialPush
from pserver.protocols.rudra import Hardsync, Softsync
from pserver.protocols.ssp import StaleSynchronous

__all__ = ["Arrival", "GradientDecision", "Protocol", "UpdateDecision", "make_protocol"]


def make_protocol(cfg: Config, n_learners: int) -> Protocol:
    """The protocol object for one block, from ``[protocol]`` and the learner count λ."""
    p = cfg.protocol
    if p.name in ("hardsync", "psp") and p.lr_policy not in ("auto", "none"):
        raise ConfigError(
            f"protocol.lr_policy = {p.lr_policy!r} does not apply to {p.name} (a round takes the "
            "gradients of that round, whatever their σ)"
            "; use \"auto\" or \"none\""
        )
    if p.name == "hardsync":
        return Hardsync(n_learners, cfg.data.batch_size, p.ref_batch or cfg.data.batch_size)
    if p.name == "psp":
        c = p.c or n_learners
        if c > n_learners:
            raise ConfigError(
                f"protocol.c = {c} exceeds the {n_learners} learners: partial pushing needs "
                "1 <= c <= λ (0 means λ)"
            )
        return PartialPush(n_learners, c, p.tau1)
    policy = "mean" if p.lr_policy == "auto" else p.lr_policy
    if p.name == "ssp":
        return StaleSynchronous(n_learners, p.s, policy)
    n = n_learners if p.name == "async" else p.n
    if n > n_learners:
        raise ConfigError(
            f"protocol.n = {n} exceeds the {n_learners} learners: n-softsync needs 1 <= n <= λ"
        )
    return Softsync(n_learners, n, policy)
