"""BMUF and MA (Chen & Huo): τ local steps per learner, then the master's block update.

``bmuf``: each learner runs ``protocol.tau`` local steps with ``optim.rule`` from the global
model (:mod:`pserver.optim.local_rule`), pushes its model delta; the shards (the master) average the
deltas into G(t) and apply block momentum (:mod:`pserver.optim.block_momentum`, eqs. 2–6) with η =
``protocol.block_momentum`` (default 1 − 1/λ, eq. 10) and ζ = ``protocol.block_lr``; learners
pull W_g(t): the Nesterov look-ahead (``protocol.nesterov = true``, NBM, the paper's
recommendation) or W(t) (CBM). ``ma``: model averaging, η = 0 and ζ = 1.

Both run the ``local-steps`` exchange (:mod:`pserver.roles.local_steps`) with ``comm.mode =
"blocking"`` only: a learner needs W_g(t) before it can start block t + 1, and its delta push
happens once per τ minibatches, so there is nothing for an overlapping engine to hide. Refused
before training: trees (an aggregator's sum of deltas would need its own round accounting) and
partial pulling (a block must start from one global model).
"""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.protocols.block import BlockRound
from pserver.strategies.base import (
    BLOCK_MOMENTUM,
    LOCAL_STEPS,
    MODEL_AVERAGING,
    Config,
    Param,
    Strategy,
)

AUTO = -1.0  # protocol.block_momentum: 1 − 1/λ (eq. 10), resolved once λ is known

TAU = Param("tau", int, 8, "> 0", help="local steps (minibatches) per learner per block")


def protocol(cfg: Config, n_learners: int) -> BlockRound:
    return BlockRound(n_learners, cfg.protocol.tau)


def check_block_momentum(s: Strategy, cfg: Config) -> None:
    eta = cfg.protocol.block_momentum
    if eta != AUTO and not 0.0 <= eta < 1.0:
        raise ConfigError(
            f"protocol.block_momentum = {eta!r}: expected η in [0, 1) (Chen & Huo eq. 3), or "
            f"{AUTO} for 1 - 1/λ (eq. 10)"
        )


def check_layout(s: Strategy, cfg: Config) -> None:
    """One exchange mode, no trees, no partial pulls (see the module docstring)."""
    if cfg.comm.mode != "blocking":
        raise ConfigError(
            f"comm.mode = {cfg.comm.mode!r}: protocol.name = {s.name!r} pulls the global model "
            "once per block of protocol.tau local steps, with nothing to overlap; use "
            'comm.mode = "blocking"'
        )
    if cfg.cluster.tree_fanout or cfg.cluster.bcast_fanout:
        raise ConfigError(
            f"cluster.tree_fanout / cluster.bcast_fanout: protocol.name = {s.name!r} runs "
            "without aggregator or broadcast trees; set both to 0"
        )
    if cfg.comm.max_inflight:
        raise ConfigError(
            f"comm.max_inflight = {cfg.comm.max_inflight}: protocol.name = {s.name!r} pushes "
            "one delta per block and waits for the next global model: leave it 0"
        )


SHARED = (TAU,)
EXCHANGES = {"blocking": LOCAL_STEPS}

BMUF = Strategy(
    name="bmuf",
    family=MODEL_AVERAGING,
    summary="tau local steps, then block momentum on the mean delta (Chen & Huo BMUF)",
    protocol=protocol,
    params=(
        Param("block_momentum", float, AUTO, help="η of eq. (3); -1: 1 - 1/λ (eq. 10)"),
        Param("block_lr", float, 1.0, "> 0", help="ζ of eq. (3), the block learning rate"),
        Param("nesterov", bool, True, help="serve W + ηΔ (NBM, eq. 6) or W (CBM, eq. 5)"),
    ),
    shared=SHARED,
    exchanges=EXCHANGES,
    waits_for_update=True,
    checks=(check_block_momentum, check_layout),
    shard_block=BLOCK_MOMENTUM,
    survives_lost_learner=True,
)

MA = Strategy(
    name="ma",
    family=MODEL_AVERAGING,
    summary="tau local steps, then the mean of the local models (model averaging)",
    protocol=protocol,
    shared=SHARED,
    exchanges=EXCHANGES,
    waits_for_update=True,
    checks=(check_layout,),
    shard_block=BLOCK_MOMENTUM,
    survives_lost_learner=True,
)
