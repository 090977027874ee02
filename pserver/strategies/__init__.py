"""The strategy registry: ``protocol.name`` -> one descriptor (``pserver.strategies.base``).

Pure: no MPI, no config import (the config takes its choices, bounds and checks from here).
Each strategy lives in its own file and is listed once in ``REGISTRY``; ``docs/config.md``
lists the same names and keys (tested). How to add one: ``docs/architecture.md``,
*Adding a strategy*.
"""

from __future__ import annotations

from typing import Any

from pserver.errors import ConfigError
from pserver.strategies.adpsgd import ADPSGD
from pserver.strategies.base import (
    BLOCK_MOMENTUM,
    FAMILIES,
    LOCAL_STEPS,
    PS,
    PS_OVERLAP,
    Param,
    Ranks,
    Strategy,
)
from pserver.strategies.bmuf import BMUF, MA
from pserver.strategies.hardsync import HARDSYNC
from pserver.strategies.hybrid import HYBRID
from pserver.strategies.psp import PSP
from pserver.strategies.softsync import ASYNC, SOFTSYNC
from pserver.strategies.ssp import SSP
from pserver.strategies.sync import SYNC

__all__ = [
    "FAMILIES", "PS", "PS_OVERLAP", "REGISTRY", "Param", "Ranks", "Strategy", "lookup",
    "make_protocol", "names", "owners", "params",
    "BLOCK_MOMENTUM", "LOCAL_STEPS",
]

REGISTRY: dict[str, Strategy] = {
    s.name: s for s in (HARDSYNC, SOFTSYNC, ASYNC, PSP, SSP, BMUF, MA, SYNC, HYBRID, ADPSGD)
}


def names() -> tuple[str, ...]:
    """Every ``protocol.name``, in registry order (the config's choices)."""
    return tuple(REGISTRY)


def lookup(name: str) -> Strategy:
    """The descriptor of ``protocol.name = name``; ``ConfigError`` naming the choices."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"protocol.name = {name!r}: expected one of {', '.join(REGISTRY)}"
        ) from None


def params() -> dict[str, Param]:
    """Every ``protocol.*`` key any strategy uses (own or shared), by key."""
    found: dict[str, Param] = {}
    for s in REGISTRY.values():
        for p in s.params + s.shared + s.layered:
            found.setdefault(p.key, p)
    return found


def owners(key: str) -> tuple[str, ...]:
    """The strategies that use ``protocol.<key>``, in registry order."""
    return tuple(s.name for s in REGISTRY.values() if s.uses(key))


def survives_lost_learner(cfg: Any) -> bool:
    """Whether a run of ``cfg`` goes on without a learner that died (issue 22): its strategy
    absorbs the loss, and no rank but the learner itself holds its traffic (no aggregator
    tree, no broadcast tree, no shared window); no periodic checkpoints (a part's drivers are
    rebuilt for the whole layout)."""
    s = lookup(cfg.protocol.name)
    c = cfg.cluster
    plain = c.tree_fanout == 0 and c.bcast_fanout == 0 and cfg.comm.transport == "messages"
    return s.survives_lost_learner and plain and cfg.run.checkpoint_interval == 0


def make_protocol(cfg: Any, n_learners: int) -> Any:
    """The shard protocol of one block, from ``[protocol]`` and the learner count λ.

    ``ConfigError`` where the strategy cannot run with this λ (checked at start-up, when the
    world size is known), or where it has no server shards at all.
    """
    s = lookup(cfg.protocol.name)
    if s.protocol is None:
        raise ConfigError(f"protocol.name = {s.name!r} runs no server shards")
    return s.protocol(cfg, n_learners)
