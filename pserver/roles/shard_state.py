"""A shard's blocks as the server driver holds them, and how they are built.

Each block is its arithmetic (``pserver.protocols.shard_block``, pure), the versions pulls read and
the
sends reading them (``shard_versions``), its snapshots (``snapshots``) and the pulls it holds.
With the shared-memory transport, a block's weights and their versions live in the node's
window, where the learners of the node read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pserver.comm.wire import Header
from pserver.plan.topology import Block
from pserver.protocols.bmuf_block import SHARD_BLOCKS
from pserver.protocols.shard_block import ShardBlock
from pserver.roles.shard_versions import ServedVersions
from pserver.roles.snapshots import Snapshots, snapshot_queue
from pserver.runtime.context import Context
from pserver.strategies.serving import Serving


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


@dataclass
class BlockBuilder:
    """Builds a shard's blocks from the whole initial vector ``weights``."""

    ctx: Context
    shm: Any  # the node's shared windows, when this shard serves through one, else None
    mode: Serving  # what the blocks compute and serve, decided once by the server
    readers: int  # ranks that pull from the shard

    def blocks(self, mine: list[Block], weights: Any) -> dict[int, BlockState]:
        itemsize = np.dtype(weights.dtype).itemsize
        depth = snapshot_queue(sum(b.size for b in mine) * itemsize)
        return {b.index: self.block(b, weights, depth) for b in mine}

    def block(self, b: Block, weights: Any, depth: int) -> BlockState:
        ctx, xp, dtype = self.ctx, self.ctx.xp, weights.dtype
        w = xp.array(weights[b.start : b.stop], dtype=dtype)
        if self.shm is not None:  # the weights live in the node's window, where learners read
            w = self.shm.weights(ctx.rank, b)
            w[...] = weights[b.start : b.stop]
        mode = self.mode
        if mode.produced:  # the versions (in the window with shm) hold f_S(w, M); w is private
            served, w = w, xp.array(weights[b.start : b.stop], dtype=dtype)
        kind = SHARD_BLOCKS[mode.block]  # BMUF's, or ShardBlock
        arith = kind.build(w, ctx.cfg, len(ctx.layout.learners), ctx.train_size, xp, mode)
        bufs = [] if mode.staged else [served if mode.produced else w]
        buffer = lambda v: self.version_buffer(b, w, v)  # noqa: E731
        versions = ServedVersions(b.index, self.version_limit(), bufs, buffer, xp)
        if mode.produced:
            arith.serve(served)  # f_S(w0, 0) = w0
            versions.served_ts = arith.ts
        return BlockState(b, arith, versions, Snapshots(ctx, b.index, b.size, dtype, depth))

    def version_limit(self) -> int:
        """Buffers per block (``comm.versions``; 0: one per reader plus the current one, so a
        pull is never held for lack of a version). The shared window holds its versions."""
        if self.shm is not None:
            return self.shm.versions[self.ctx.rank]
        return self.ctx.cfg.comm.versions or 1 + self.readers

    def version_buffer(self, b: Block, w: Any, version: int) -> Any:
        """A new buffer for version ``version`` of block ``b`` (in the window with shm)."""
        if self.shm is not None:
            return self.shm.weights(self.ctx.rank, b, version)
        return self.ctx.xp.empty_like(w)
