"""Synchronization protocols: pure state machines, one instance per parameter block.

Which protocol a run uses is the strategy registry's business (``pserver.strategies``): each
strategy's descriptor names its protocol factory.
"""

from __future__ import annotations

from typing import Any

from pserver.protocols.base import Arrival, GradientDecision, Protocol, UpdateDecision

__all__ = ["Arrival", "GradientDecision", "Protocol", "UpdateDecision", "make_protocol"]


def make_protocol(cfg: Any, n_learners: int) -> Protocol:
    """The protocol object for one block of ``cfg`` (a ``pserver.plan.config.Config``) with λ
    learners: the factory of the strategy ``protocol.name`` names in the registry."""
    from pserver.strategies import make_protocol as from_registry  # it imports this package

    return from_registry(cfg, n_learners)
