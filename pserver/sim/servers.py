"""The shards of a simulated parameter-server run, and where each block of the model lives.

The model is cut into blocks as a real run cuts it (``pserver.plan.topology.split_blocks``:
``blocks.count`` blocks of nearly equal size, shard s owning a contiguous run of them, block i
on shard ⌊i·S/blocks⌋), and each shard is a ``pserver.sim.shard.SimShard`` of its own: its own
queue of messages, its own cost (``inject.server_factor`` on the slow one) and its own place on
the shared cores. A learner pushes each block to the shard that owns it and pulls it back from
there (``pserver.sim.learner``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pserver.plan.config import Config
from pserver.plan.topology import Block, split_blocks
from pserver.sim.costs import Costs
from pserver.sim.rows import Rows
from pserver.sim.shard import SimShard


def model_blocks(cfg: Config, nbytes: int) -> list[Block]:
    """The blocks of a model of ``nbytes`` bytes under ``cfg`` (``blocks.split = "size"``); a
    ``ConfigError`` for a count the real run refuses (more blocks than parameters, fewer than
    shards)."""
    n_params = nbytes // np.dtype(cfg.model.dtype).itemsize
    return split_blocks(n_params, [n_params], "size", cfg.blocks.count, cfg.cluster.servers)


class Servers:
    """``cluster.servers`` simulated shards over the blocks of ``model_blocks``; ``kind``: the
    shard's class (``pserver.sim.tree.TreeShard`` under an aggregator tree)."""

    def __init__(
        self, loop: Any, cfg: Config, costs: Costs, rows: Rows, n_learners: int, train_size: int,
        kind: type[SimShard] = SimShard,
    ) -> None:  # fmt: skip
        self.blocks: Sequence[Block] = model_blocks(cfg, costs.nbytes)
        self.shards = [
            kind(loop, cfg, costs, rows, n_learners, train_size, s,
                     [b for b in self.blocks if b.shard == s])
            for s in range(cfg.cluster.servers)
        ]  # fmt: skip
        self.of = [self.shards[b.shard] for b in self.blocks]  # block index → its shard
        self.nbytes = [b.size * np.dtype(cfg.model.dtype).itemsize for b in self.blocks]
        self._learners: list[Any] = []

    @property
    def learners(self) -> list[Any]:
        """The simulated learners by index (every shard answers them)."""
        return self._learners

    @learners.setter
    def learners(self, learners: list[Any]) -> None:
        self._learners = learners
        for shard in self.shards:
            shard.learners = learners

    @property
    def cores(self) -> Any:
        return self.shards[0].cores

    @cores.setter
    def cores(self, cores: Any) -> None:
        """``sim.cores``: every shard runs its messages on the node's processors."""
        for shard in self.shards:
            shard.cores = cores

    @property
    def updates(self) -> int:
        """The updates the shards made (each shard's highest block timestamp, summed)."""
        return sum(shard.updated for shard in self.shards)

    def end_rows(self) -> None:
        """Every shard's ``servers`` row and its blocks' ``blocks`` rows."""
        for shard in self.shards:
            shard.end_rows()


class Via:
    """A learner's route to every block through one node in place of the shards (its
    aggregator, ``pserver.sim.tree.plant``): what ``Servers`` offers a learner."""

    def __init__(self, node: Any, blocks: Sequence[Block], nbytes: list[int]) -> None:
        self.blocks, self.nbytes = blocks, nbytes
        self.of = [node] * len(blocks)
        self.shards = [node]
