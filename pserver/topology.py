"""World size + config -> the role of every rank and which server owns which parameter block.

Pure logic: nothing here touches MPI, so every layout can be checked in one process.

Rank order: the parameter-server shards first (rank 0 is shard 0), then the statistics server,
then the data server, then the learners. Keeping the servers at the low ranks means a hostfile
that lists the server node first puts every shard there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pserver.config import Config
from pserver.errors import ConfigError, TopologyError

MAX_BLOCKS = 30000  # replies are tagged 1000 + block; MPI guarantees tags up to 32767


@enum.unique
class Role(enum.Enum):
    SERVER = "server"
    STATS = "stats"
    DATA = "data"
    LEARNER = "learner"


@dataclass(frozen=True)
class Layout:
    """Which rank plays which role; built identically on every rank."""

    world_size: int
    servers: tuple[int, ...]
    stats: int
    data: int
    learners: tuple[int, ...]

    def role(self, rank: int) -> Role:
        if rank in self.servers:
            return Role.SERVER
        if rank == self.stats:
            return Role.STATS
        if rank == self.data:
            return Role.DATA
        if rank in self.learners:
            return Role.LEARNER
        raise TopologyError(f"rank {rank} is outside the world of {self.world_size} ranks")

    def index(self, rank: int) -> int:
        """Position of ``rank`` among the ranks of its role (learner 0, 1, ...; shard 0, 1, ...)."""
        role = self.role(rank)
        if role is Role.SERVER:
            return self.servers.index(rank)
        if role is Role.LEARNER:
            return self.learners.index(rank)
        return 0

    def describe(self, rank: int) -> str:
        role = self.role(rank)
        if role in (Role.SERVER, Role.LEARNER):
            return f"{role.value} {self.index(rank)}"
        return f"{role.value} server"


def make_layout(world_size: int, cfg: Config) -> Layout:
    """Assign roles; a world size that does not fit is an error that says how to fix it."""
    n_servers = cfg.cluster.servers
    fixed = 2 + n_servers  # stats + data + shards
    n_learners = cfg.cluster.learners or world_size - fixed
    need = fixed + max(n_learners, 1)
    if n_learners < 1 or world_size != fixed + n_learners:
        wanted = "all remaining ranks" if cfg.cluster.learners == 0 else str(n_learners)
        raise TopologyError(
            f"world size {world_size} does not fit {n_servers} server(s) + 1 statistics server "
            f"+ 1 data server + {wanted} learner(s): run with mpiexec -n {need}"
            + ("" if cfg.cluster.learners == 0 else " or set cluster.learners=0")
        )
    servers = tuple(range(n_servers))
    learners = tuple(range(fixed, fixed + n_learners))
    return Layout(world_size, servers, n_servers, n_servers + 1, learners)


@dataclass(frozen=True)
class Block:
    """A contiguous slice [start, stop) of the flat parameter vector, owned by one shard."""

    index: int
    start: int
    stop: int
    shard: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def split_blocks(
    n_params: int, layer_sizes: list[int], split: str, count: int, n_servers: int
) -> list[Block]:
    """Cut the flat parameter vector into blocks and give each shard a contiguous run of them.

    ``split = "size"`` makes ``count`` blocks of nearly equal size; ``split = "layer"`` makes
    one block per parameter tensor. Contiguous ownership keeps each shard's share of the model
    one slice of memory, so a whole-shard operation is a single buffer.
    """
    if split == "layer":
        bounds = [0]
        for size in layer_sizes:
            bounds.append(bounds[-1] + size)
        if bounds[-1] != n_params:
            raise ConfigError(f"layer sizes add up to {bounds[-1]}, not {n_params} parameters")
    else:
        if count > n_params:
            raise ConfigError(f"blocks.count = {count} exceeds the {n_params} model parameters")
        bounds = [n_params * i // count for i in range(count + 1)]
    n_blocks = len(bounds) - 1
    if n_blocks > MAX_BLOCKS:
        raise ConfigError(f"{n_blocks} blocks exceed the {MAX_BLOCKS} that MPI tags can address")
    if n_blocks < n_servers:
        raise ConfigError(
            f"{n_blocks} parameter block(s) cannot feed cluster.servers = {n_servers} shards: "
            f'set blocks.count >= {n_servers} (with blocks.split = "size")'
        )
    return [Block(i, bounds[i], bounds[i + 1], i * n_servers // n_blocks) for i in range(n_blocks)]
