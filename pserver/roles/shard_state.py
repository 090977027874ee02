"""A shard's blocks as the server driver holds them, how they are built, and how it serves.

:class:`ShardPath` is the shard's serving path, decided once at construction from the plan:
what its blocks compute and serve (``pserver.strategies.serving``: plain, predicted, block
momentum; staged host copies or not) and how payloads travel (messages, or the node's shared
window, with or without zero copy). The server, its block builder and its pull answers read
this one frozen value instead of testing the transport and the strategy each on their own.

Each block is its arithmetic (``pserver.protocols.shard_block``, pure), the versions pulls read and
the
sends reading them (``shard_versions``), its snapshots (``snapshots``) and the pulls it holds.
With the shared-memory transport, a block's weights and their versions live in the node's
window, where the learners of the node read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pserver.comm.wire import Header
from pserver.plan.topology import Block
from pserver.protocols.bmuf_block import SHARD_BLOCKS
from pserver.protocols.shard_block import ShardBlock
from pserver.roles.shard_versions import ServedVersions
from pserver.roles.snapshots import Snapshots, StatsLink, snapshot_queue
from pserver.strategies.serving import Serving, serving

if TYPE_CHECKING:
    from types import ModuleType

    from pserver.comm.backend import Backend
    from pserver.comm.channels import Channels
    from pserver.plan.config import Config
    from pserver.plan.topology import Layout


@dataclass(frozen=True)
class ShardSide:
    """What a shard's helpers (:class:`BlockBuilder`, ``PullAnswers``) read of the run, built
    once by the server driver: the config, the layout and this rank, the training set's size,
    the backend, the channels and the run's clock."""

    cfg: Config
    layout: Layout
    rank: int
    train_size: int
    backend: Backend
    channels: Channels
    now: Callable[[], float]  # seconds since the common start

    @property
    def xp(self) -> ModuleType:
        return self.backend.xp


@dataclass
class BlockState:
    """One block at the shard: its arithmetic (``pserver.protocols.shard_block``), the versions
    pulls
    read and the sends reading them, its snapshots, and the pulls it holds."""

    block: Block
    arith: ShardBlock
    versions: ServedVersions
    snaps: Snapshots
    waiting_pulls: list[Header] = field(default_factory=list)  # held by the pull rule
    starved: list[Header] = field(default_factory=list)  # pulls held until a version is free


@dataclass(frozen=True)
class ShardPath:
    """How one shard serves (see the module docstring): decided once, read everywhere."""

    mode: Serving  # what the blocks compute and serve (plain, predicted, BMUF's; staged)
    shm: Any  # the node's shared windows, when this shard serves through one, else None
    window_peers: frozenset[int]  # learners whose payloads go through our window
    zero_copy: bool  # those learners compute on the window's versions in place (one block)

    @classmethod
    def of(cls, cfg: Config, rank: int, windows: Any, staged: bool) -> ShardPath:
        """The path of shard rank ``rank`` in the run ``cfg``; ``windows``: the node's shared
        windows (None without ``comm.transport = "shm"``); ``staged``: its payloads go through
        host buffers (``pserver.comm.payload``), which a shared window makes unnecessary."""
        shm = windows if windows is not None and rank in windows.local else None
        peers = frozenset(shm.local[rank] if shm is not None else ())
        zero_copy = shm is not None and shm.zero_copy(rank)
        return cls(serving(cfg, staged=staged and shm is None), shm, peers, zero_copy)

    def shared(self, rank: int) -> bool:
        """Whether learner ``rank``'s payloads go through our window."""
        return rank in self.window_peers

    def lends(self, rank: int) -> bool:
        """Whether learner ``rank`` computes on our window's current version in place."""
        return self.zero_copy and rank in self.window_peers


@dataclass
class BlockBuilder:
    """Builds a shard's blocks from the whole initial vector ``weights``."""

    side: ShardSide
    path: ShardPath  # how the shard serves, decided once by the server
    readers: int  # ranks that pull from the shard

    @property
    def shm(self) -> Any:
        return self.path.shm

    @property
    def mode(self) -> Serving:
        return self.path.mode

    def blocks(self, mine: list[Block], weights: Any) -> dict[int, BlockState]:
        itemsize = np.dtype(weights.dtype).itemsize
        depth = snapshot_queue(sum(b.size for b in mine) * itemsize)
        return {b.index: self.block(b, weights, depth) for b in mine}

    def block(self, b: Block, weights: Any, depth: int) -> BlockState:
        side, xp, dtype = self.side, self.side.xp, weights.dtype
        w = xp.array(weights[b.start : b.stop], dtype=dtype)
        if self.shm is not None:  # the weights live in the node's window, where learners read
            w = self.shm.weights(side.rank, b)
            w[...] = weights[b.start : b.stop]
        mode = self.mode
        if mode.produced:  # the versions (in the window with shm) hold f_S(w, M); w is private
            served, w = w, xp.array(weights[b.start : b.stop], dtype=dtype)
        kind = SHARD_BLOCKS[mode.block]  # BMUF's, or ShardBlock
        arith = kind.build(w, side.cfg, len(side.layout.learners), side.train_size, xp, mode)
        bufs = [] if mode.staged else [served if mode.produced else w]
        buffer = lambda v: self.version_buffer(b, w, v)  # noqa: E731
        versions = ServedVersions(b.index, self.version_limit(), bufs, buffer, xp)
        if mode.produced:
            arith.serve(served)  # f_S(w0, 0) = w0
            versions.served_ts = arith.ts
        link = StatsLink(side.channels.stats, side.layout.stats, side.rank,
                         side.cfg.run.epochs, side.backend)  # fmt: skip
        return BlockState(b, arith, versions, Snapshots(link, b.index, b.size, dtype, depth))

    def version_limit(self) -> int:
        """Buffers per block (``comm.versions``; 0: one per reader plus the current one, so a
        pull is never held for lack of a version). The shared window holds its versions."""
        if self.shm is not None:
            return self.shm.versions[self.side.rank]
        return self.side.cfg.comm.versions or 1 + self.readers

    def version_buffer(self, b: Block, w: Any, version: int) -> Any:
        """A new buffer for version ``version`` of block ``b`` (in the window with shm)."""
        if self.shm is not None:
            return self.shm.weights(self.side.rank, b, version)
        return self.side.xp.empty_like(w)
