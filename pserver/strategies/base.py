"""What a strategy descriptor holds: the pure data of the registry (``pserver.strategies``).

A strategy is everything ``protocol.name`` selects: its family, its own typed ``protocol.*``
parameters, the ranks it needs, the shard protocol its server blocks run (none for a family
without servers), the learner exchange it uses, and the checks that tie its keys to the rest
of the config. Nothing here imports the config (the config imports the registry); a check
receives the descriptor and the ``pserver.plan.config.Config`` (types, choices and bounds already
checked) and raises ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pserver.errors import ConfigError

PARAMETER_SERVER = "parameter server"
MODEL_AVERAGING = "model averaging"
PREDICTION = "prediction"
COLLECTIVE = "collective/gossip"
FAMILIES = (PARAMETER_SERVER, MODEL_AVERAGING, PREDICTION, COLLECTIVE)

#: Learner exchanges, by name (resolved to classes by ``pserver.job.cli``'s driver table).
PS = "ps"  # pull weights, compute, push gradients, one step after the other
PS_OVERLAP = "ps-overlap"  # the same, with pulls and pushes in flight during compute
LOCAL_STEPS = "local-steps"  # τ local steps, then push the model delta, pull (BMUF, MA)

#: Shard block kinds beside the plain one, by name (resolved by ``pserver.roles.shard_state``).
BLOCK_MOMENTUM = "block-momentum"  # BMUF's master: eqs. (2)-(6) of Chen & Huo

Config = Any  # pserver.plan.config.Config: not imported, the config imports the registry
Check = Callable[["Strategy", Config], None]
ProtocolFactory = Callable[[Config, int], Any]  # (config, λ) -> pserver.protocols.Protocol


@dataclass(frozen=True)
class Param:
    """One ``protocol.*`` key: its type, default and bound (``"> 0"``, ``">= 0"`` or None,
    checked with the config's other bounds). The type and default must equal
    ``pserver.plan.config.ProtocolConfig``'s field (tested)."""

    key: str  # the name in [protocol]
    type: type
    default: Any
    bound: str | None = None
    help: str = ""


@dataclass(frozen=True)
class Ranks:
    """Which ranks a strategy needs beside the learners. ``servers``: parameter-server
    shards (``cluster.servers`` >= 1 when True, == 0 when False); ``data``, ``stats``: the
    data and statistics servers (every strategy today; the layout always places both)."""

    servers: bool = True
    data: bool = True
    stats: bool = True


@dataclass(frozen=True)
class Layer:
    """A strategy of one family that runs over the strategies of another, selected by a boolean
    key beside ``protocol.name`` (PP-ASGD, Sato et al. 2017: ``protocol.predict = true`` over
    async, softsync, SSP and PSP; ``pserver.strategies.prediction``). A host strategy declares
    it in ``Strategy.layers``; its family's checks run the layer's at :func:`check_layers`.

    ``params``: its keys, the switch first; ``checks``: receive the host descriptor and the
    config, as a strategy's do; ``serves``: when on, a shard serves its pulls a model other
    than ``w`` (PP-ASGD's f_S(w, M)), so the shard's versions hold that model
    (``pserver.strategies.serving``)."""

    name: str
    family: str
    summary: str
    params: tuple[Param, ...]
    checks: tuple[Check, ...] = ()
    serves: bool = False

    @property
    def switch(self) -> str:
        """The ``protocol.*`` key that turns the layer on."""
        return self.params[0].key

    def on(self, cfg: Config) -> bool:
        """Whether ``cfg`` selects this layer."""
        return bool(getattr(cfg.protocol, self.switch))


def check_layers(s: Strategy, cfg: Config) -> None:
    """The checks of every layer ``s`` declares, in order (a family's check: its place in the
    family's ``CHECKS`` is where the layers' errors come)."""
    for layer in s.layers:
        for check in layer.checks:
            check(s, cfg)


@dataclass(frozen=True)
class Strategy:
    """One entry of the registry. ``params``: the keys of this strategy alone; ``shared``:
    keys it shares with its family (the family's descriptors list the same ones);
    ``exchanges``: ``comm.mode`` -> learner exchange name, a missing mode is refused by
    :meth:`exchange`; ``waits_for_update``: learners compute each iteration on the weights
    of the latest update (the shard protocol's attribute of the same name, tested equal);
    ``tree``: the aggregator tree may sum its gradients (``cluster.tree_fanout``);
    ``layers``: strategies of another family that may run over this one (:class:`Layer`:
    PP-ASGD over the parameter-server strategies), whose keys are :attr:`layered`;
    ``lockstep``: see the field."""

    name: str
    family: str
    summary: str
    protocol: ProtocolFactory | None
    params: tuple[Param, ...] = ()
    shared: tuple[Param, ...] = ()
    ranks: Ranks = Ranks()
    exchanges: Mapping[str, str] = field(default_factory=dict)
    waits_for_update: bool = False
    tree: bool = False
    checks: tuple[Check, ...] = ()
    layers: tuple[Layer, ...] = ()
    # learners-only: every learner takes the same number of steps (SYNC, HYBRID: their
    # allreduce needs every learner); False: free-running learners (pserver.protocols.lockstep)
    lockstep: bool = False
    #: the shard block's arithmetic, by name (resolved by ``pserver.roles.shard_state``):
    #: "" is ``pserver.protocols.shard_block.ShardBlock``
    shard_block: str = ""
    # the fewest learners it can run with (checked at start-up, when λ is known)
    min_learners: int = 1
    #: checkpoints (``pserver.ckpt``): every role of the strategy saves and restores its state
    #: (``--resume``, the end's and a signal's checkpoint); False: refused with one line, and a
    #: SIGTERM ends its ranks at once. The learner's own record follows from its exchange
    #: (``pserver.ckpt.resume.LEARNER_RECORDS``), so nothing else names the strategy.
    checkpoints: bool = True
    #: its learners can stop at one step boundary for a periodic checkpoint
    #: (``run.checkpoint_interval``); when False, ``why_no_pause`` says why
    pauses: bool = True
    why_no_pause: str = ""
    #: issue 22: a learner's death is a departure its protocol absorbs (``Protocol.lose``),
    #: where the MPI library offers ULFM (``pserver.comm.departures``)
    survives_lost_learner: bool = False

    @property
    def layered(self) -> tuple[Param, ...]:
        """The keys of the layers over this strategy, not of its family."""
        return tuple(p for layer in self.layers for p in layer.params)

    def layers_on(self, cfg: Config) -> tuple[Layer, ...]:
        """The layers ``cfg`` selects over this strategy."""
        return tuple(layer for layer in self.layers if layer.on(cfg))

    def uses(self, key: str) -> bool:
        """Whether ``protocol.<key>`` means anything to this strategy."""
        return any(p.key == key for p in self.params + self.shared + self.layered)

    def exchange(self, mode: str) -> str:
        """The learner exchange for ``comm.mode = mode``; ``ConfigError`` if it has none."""
        if mode not in self.exchanges:
            modes = " or ".join(f'"{m}"' for m in self.exchanges)
            raise ConfigError(
                f"comm.mode = {mode!r}: protocol.name = {self.name!r} has no learner exchange "
                f"for it; use comm.mode = {modes}"
            )
        return self.exchanges[mode]

    def check(self, cfg: Config) -> None:
        """This strategy's cross-field checks, in order; the first failure raises."""
        for check in self.checks:
            check(self, cfg)
