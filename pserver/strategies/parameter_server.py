"""The parameter-server family: the keys every PS strategy shares and their checks.

Every PS strategy (hardsync, softsync, async, psp, ssp) keeps the model on server shards;
learners pull weights and push gradients through the ``ps`` exchange, or ``ps-overlap`` with
``comm.mode`` other than blocking. The learner side — partial pulling (PSP-SGD Algorithm 1,
worker lines 3-15) and which round a push answers — is the family's, not one strategy's.
"""

from __future__ import annotations

import math

from pserver.errors import ConfigError
from pserver.protocols.partial_pull import EPS
from pserver.strategies.base import PS, PS_OVERLAP, Config, Param, Strategy, check_layers
from pserver.strategies.prediction import PP_ASGD

#: The ``protocol.*`` keys of the whole family (``Strategy.shared``).
SHARED = (
    Param("lr_policy", str, "auto", help="learning-rate modulation by staleness"),
    Param("pull_fraction", float, 1.0, help="partial pulling: share of blocks to wait for"),
    Param("tau2", float, 0.0, ">= 0", help="partial pulling: seconds to wait for more blocks"),
    Param("pull_timestamp", str, "auto", help="which round a push answers"),
)

#: The layers over every PS strategy (``Strategy.layers``): PP-ASGD's prediction.
LAYERS = (PP_ASGD,)

#: A learner exchange for every ``comm.mode``.
EXCHANGES = {"blocking": PS, "nonblocking": PS_OVERLAP, "thread": PS_OVERLAP}


def check_pull_fraction(s: Strategy, cfg: Config) -> None:
    b = cfg.protocol.pull_fraction
    if not 0.0 < b <= 1.0:
        raise ConfigError(f"protocol.pull_fraction = {b!r}: expected a share in (0, 1]")


def check_pull_block_count(s: Strategy, cfg: Config) -> None:
    """Last of the family's checks, so that a combination partial pulling forbids says so first."""
    if cfg.blocks.split == "size":  # the count is known before the model; "layer": at start-up
        check_pull_blocks(cfg.protocol.pull_fraction, cfg.blocks.count)


def pull_blocks_needed(fraction: float, n_blocks: int) -> int:
    """⌈b · blocks⌉ (at least 1): the blocks a learner waits for (PSP-SGD Algorithm 1, worker
    line 5; ``pserver.protocols.partial_pull.PartialPull.count``)."""
    return min(n_blocks, max(1, math.ceil(fraction * n_blocks - EPS)))


def check_pull_blocks(fraction: float, n_blocks: int) -> None:
    """Partial pulling that cannot skip a block is refused, not run as a full pull in silence
    (issue 25): with b < 1 a learner must be able to start before every block is in."""
    if fraction >= 1.0 or pull_blocks_needed(fraction, n_blocks) < n_blocks:
        return
    fewest = next(n for n in range(2, 1 << 20) if pull_blocks_needed(fraction, n) < n)
    raise ConfigError(
        f"protocol.pull_fraction = {fraction!r} with {n_blocks} parameter block(s): a learner "
        f"waits for ⌈{fraction!r} · {n_blocks}⌉ = {n_blocks} block(s), every one, so partial "
        f'pulling would never skip a block; set blocks.count >= {fewest} (blocks.split = "size")'
        " or protocol.pull_fraction = 1"
    )


def round_rule(s: Strategy, cfg: Config) -> str:
    """The round a push answers: ``"iteration"`` or ``"block"`` (pserver/protocols/rounds.py).

    ``auto``: the iteration rule of PSP-SGD's Algorithm 1 where partial pulling meets a
    strategy that waits for every learner (the block rule can deadlock there), the block rule
    elsewhere (with ``pull_fraction = 1`` the two take the same gradients).
    """
    p = cfg.protocol
    if p.pull_timestamp != "auto":
        return p.pull_timestamp
    return "iteration" if s.waits_for_update and p.pull_fraction < 1.0 else "block"


def check_pull_timestamp(s: Strategy, cfg: Config) -> None:
    """Refuse the combinations of ``protocol.pull_timestamp`` that can hang or mean nothing."""
    p, rule = cfg.protocol, cfg.protocol.pull_timestamp
    if rule == "block" and s.waits_for_update and p.pull_fraction < 1.0:
        raise ConfigError(
            f'protocol.pull_timestamp = "block" with protocol.pull_fraction < 1 can deadlock '
            f"under {p.name}: a gradient computed on a kept, older block copy carries that "
            "block's timestamp, is dropped and never counts as the learner's response; use "
            'pull_timestamp = "iteration" (or "auto"), PSP-SGD\'s rule'
        )
    if rule != "iteration":
        return
    if not s.waits_for_update:
        raise ConfigError(
            f'protocol.pull_timestamp = "iteration" applies to hardsync and psp only; {p.name} '
            'accepts gradients of any age: use "auto" or "block"'
        )
    if cfg.cluster.tree_fanout or cfg.comm.mode != "blocking":
        raise ConfigError(
            'protocol.pull_timestamp = "iteration" needs cluster.tree_fanout = 0 and '
            'comm.mode = "blocking": aggregators relay (learner, timestamp) pairs without the '
            "iteration, and the overlapped learners (and the bcast tree they need) tag each "
            "block with its own timestamp"
        )


def check_overlap(s: Strategy, cfg: Config) -> None:
    """An overlapped learner computes on weights it pulled before its last push was applied."""
    mode = cfg.comm.mode
    if mode == "blocking":
        return
    if mode not in s.exchanges:
        raise ConfigError(
            f"comm.mode = {mode!r} overlaps pulls with compute, which {s.name}'s bound does not "
            'allow: use comm.mode = "blocking"'
        )
    if cfg.protocol.pull_fraction < 1.0:
        raise ConfigError(
            f"comm.mode = {mode!r} overlaps pulls with compute, which partial pulling "
            '(protocol.pull_fraction < 1) does not allow: use comm.mode = "blocking"'
        )


def check_max_inflight(s: Strategy, cfg: Config) -> None:
    if cfg.comm.max_inflight and (cfg.comm.mode == "blocking" or s.waits_for_update):
        raise ConfigError(
            f"comm.max_inflight = {cfg.comm.max_inflight}: bounds how far an overlapped learner "
            "runs ahead of its own gradients under async and softsync; with comm.mode = "
            f"{cfg.comm.mode!r} and protocol.name = {cfg.protocol.name!r} a learner already "
            "waits for each new model: leave it 0"
        )


def check_tree(s: Strategy, cfg: Config) -> None:
    p = cfg.protocol
    if cfg.cluster.tree_fanout and (
        not s.tree or p.lr_policy == "per-gradient" or p.pull_fraction < 1.0
    ):
        raise ConfigError(
            "cluster.tree_fanout: aggregators sum gradients before the server sees them, which "
            "psp, ssp, per-gradient learning rates and partial pulling need apart; use "
            "hardsync, softsync or async with the tree"
        )


def check_round_lr_policy(s: Strategy, cfg: Config) -> None:
    """hardsync and psp: a round takes the gradients of that round, whatever their σ."""
    policy = cfg.protocol.lr_policy
    if policy not in ("auto", "none"):
        raise ConfigError(
            f"protocol.lr_policy = {policy!r} does not apply to {s.name} (a round takes the "
            "gradients of that round, whatever their σ); use \"auto\" or \"none\""
        )


#: The family's checks, run before each strategy's own (same order as before the registry;
#: ``check_layers`` runs PP-ASGD's where its check always ran).
CHECKS = (
    check_pull_fraction, check_pull_timestamp, check_overlap, check_max_inflight, check_tree,
    check_layers, check_pull_block_count,
)  # fmt: skip


def lr_policy(cfg: Config, auto: str = "nominal") -> str:
    """``protocol.lr_policy`` with ``auto`` resolved to the strategy's default, ``auto``.

    n-softsync and async: ``nominal``, Rudra's eq. (6) as published, α0/n (α0/λ for async),
    the rule of the paper's Fig. 4 and Table IV; the measured variants (``mean``:
    α0/max(⟨σ⟩, 1) of each update's measured ⟨σ⟩; ``per-gradient``: footnote 2's 1/max(σ, 1))
    are options under their own names. SSP passes ``mean``: it has no n (docs/protocols.md,
    *Deviations from the papers*)."""
    p = cfg.protocol.lr_policy
    return auto if p == "auto" else p
