"""World size + config -> the role of every rank and which server owns which parameter block.

Pure logic: nothing here touches MPI, so every layout can be checked in one process.

Rank order: the parameter-server shards first (rank 0 is shard 0), then the statistics server,
then the data server, then the learners. Keeping the servers at the low ranks means a hostfile
that lists the server node first puts every shard there.

A learners-only strategy (``Strategy.ranks.servers`` False: SYNC, HYBRID, ADPSGD) has no
shard: ``cluster.servers = 0``, the statistics server is rank 0, the data server rank 1, the
learners the rest; its blocks belong to no shard (``NO_SHARD``) and only cut the model for
the statistics server's snapshots.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pserver.errors import ConfigError, TopologyError
from pserver.plan.config import Config

NO_SHARD = -1  # the shard of a block when the run has no parameter server
MAX_BLOCKS = 30000  # replies are tagged 1000 + block; MPI guarantees tags up to 32767


@enum.unique
class Role(enum.Enum):
    SERVER = "server"
    STATS = "stats"
    DATA = "data"
    AGGREGATOR = "aggregator"
    LEARNER = "learner"


#: The Layout field that lists the ranks of each numbered role (one rank each: stats, data).
ROLE_FIELDS = {Role.SERVER: "servers", Role.AGGREGATOR: "aggregators", Role.LEARNER: "learners"}
#: Roles described with their index ("learner 3"); the others are "stats server", "data server".
NUMBERED = frozenset(ROLE_FIELDS)


@dataclass(frozen=True)
class Layout:
    """Which rank plays which role; built identically on every rank.

    ``parent`` maps a learner or aggregator to the aggregator it talks to; those missing from
    it talk to the server shards directly (always, without a tree).
    """

    world_size: int
    servers: tuple[int, ...]
    stats: int
    data: int
    learners: tuple[int, ...]
    aggregators: tuple[int, ...] = ()
    parent: dict[int, int] = field(default_factory=dict)
    bcast_parent: dict[int, int] = field(default_factory=dict)  # learner -> learner it pulls from
    _roles: dict[int, Role] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._roles.update({r: role for role in Role for r in self.members(role)})

    def members(self, role: Role) -> tuple[int, ...]:
        """The ranks playing ``role``, in the order of their index."""
        if role is Role.STATS or role is Role.DATA:
            return (getattr(self, role.value),)
        return getattr(self, ROLE_FIELDS[role])

    def role(self, rank: int) -> Role:
        role = self._roles.get(rank)
        if role is None:
            raise TopologyError(f"rank {rank} is outside the world of {self.world_size} ranks")
        return role

    def index(self, rank: int) -> int:
        """Position of ``rank`` among the ranks of its role (learner 0, 1, ...; shard 0, 1, ...)."""
        return self.members(self.role(rank)).index(rank)

    def describe(self, rank: int) -> str:
        role = self.role(rank)
        if role in NUMBERED:
            return f"{role.value} {self.index(rank)}"
        return f"{role.value} server"

    def children(self, rank: int | None) -> tuple[int, ...]:
        """Ranks whose pushes and pulls go to ``rank`` (None: to the server shards)."""
        nodes = self.learners + self.aggregators
        return tuple(r for r in sorted(nodes) if self.parent.get(r) == rank)

    def upstream(self, rank: int, shard_rank: int) -> int:
        """Where ``rank`` sends a block owned by the server at ``shard_rank``."""
        return self.parent.get(rank, shard_rank)


def tree_size(n_learners: int, fanout: int) -> int:
    """Aggregators of a fan-out-``k`` tree over λ learners (0 for a flat layout)."""
    total, level = 0, n_learners
    while fanout and (level > fanout or total == 0):  # at least one level of aggregators
        level = math.ceil(level / fanout)
        total += level
    return total


def make_layout(world_size: int, cfg: Config, nodes: Sequence[int] | None = None) -> Layout:
    """Assign roles; a world size that does not fit is an error that says how to fix it.

    ``nodes`` names the node of every rank (from the shared-memory split); with a tree it is
    used to put each leaf aggregator on the node of its learners.
    """
    n_servers, k = cfg.cluster.servers, cfg.cluster.tree_fanout
    fixed = 2 + n_servers  # stats + data + shards
    n_learners = cfg.cluster.learners
    if n_learners == 0:  # every rank left, after the aggregators this many learners need
        n_learners = max(
            (n for n in range(1, world_size) if fixed + n + tree_size(n, k) <= world_size),
            default=0,
        )
    need = fixed + max(n_learners, 1) + tree_size(max(n_learners, 1), k)
    if n_learners < 1 or world_size != fixed + n_learners + tree_size(n_learners, k):
        tree = f" + {tree_size(max(n_learners, 1), k)} aggregator(s) (tree_fanout {k})" if k else ""
        if cfg.cluster.learners:  # λ asked for: the -n that gives it under this strategy
            raise TopologyError(
                f"cluster.learners = {n_learners} under protocol.name = "
                f'"{cfg.protocol.name}" needs mpiexec -n {need} ({n_servers} server(s) + 1 '
                f"statistics server + 1 data server + {n_learners} learner(s){tree}), not "
                f"{world_size} ranks: run with mpiexec -n {need} or set cluster.learners=0"
            )
        raise TopologyError(
            f"world size {world_size} does not fit {n_servers} server(s) + 1 statistics server "
            f"+ 1 data server + all remaining ranks learner(s){tree}: run with mpiexec -n {need}"
        )
    servers = tuple(range(n_servers))
    if not k:
        learners = tuple(range(fixed, fixed + n_learners))
        layout = Layout(world_size, servers, n_servers, n_servers + 1, learners)
    else:
        layout = tree_layout(world_size, servers, n_learners, k, nodes)
    if cfg.cluster.bcast_fanout:
        tree = broadcast_tree(layout, cfg.cluster.bcast_fanout, cfg.cluster.bcast_tree)
        return replace(layout, bcast_parent=tree)
    return layout


def world_size(cfg: Config) -> int:
    """The ``mpiexec -n`` of a resolved config (``cluster.learners`` = λ set): the one world
    size :func:`make_layout` accepts (shards, statistics and data
    servers, aggregators and λ learners, as the strategy lays them out)."""
    c = cfg.cluster
    bound = 16 * (c.learners + c.servers + 2) + 64  # a tree adds fewer aggregators than this
    for n in range(1, bound):
        try:
            make_layout(n, cfg)
        except TopologyError:
            continue
        return n
    raise ConfigError(f"no world size up to {bound} fits cluster.learners = {c.learners}")


def broadcast_tree(layout: Layout, fanout: int, shape: str = "root") -> dict[int, int]:
    """Rudra-adv*'s learner broadcast tree: a fan-out-k heap; only a heap's root pulls from
    its upstream (a shard or its leaf aggregator), every other learner from its heap parent.

    ``shape = "root"``: one heap over every learner, as in the paper (§III-C: "the weights
    downcast tree, which consists of the top level parameter server node and all the
    learners"); with an aggregator tree its root learner's weights come down the aggregators
    above it. ``"group"``: one heap per upstream, over the learners that share it (without an
    aggregator tree both shapes are the same heap).
    """
    groups: dict[int | None, list[int]] = {}
    for rank in layout.learners:
        groups.setdefault(layout.parent.get(rank) if shape == "group" else None, []).append(rank)
    return {
        members[i]: members[(i - 1) // fanout]
        for members in groups.values()
        for i in range(1, len(members))
    }


def tree_layout(
    world_size: int,
    servers: tuple[int, ...],
    n_learners: int,
    k: int,
    nodes: Sequence[int] | None = None,
) -> Layout:
    """Rudra-adv's aggregator tree, ranks in depth-first order, or placed by node.

    In depth-first order every aggregator directly precedes its subtree, so a hostfile that
    fills nodes with consecutive ranks puts each leaf aggregator on the node of its learners
    (their traffic then goes through shared memory), and only the sums cross the network. When
    ``nodes`` (the node of every rank) shows that the launcher placed ranks otherwise (round
    robin, uneven slots), the ranks are reassigned by :func:`place_by_node`.
    """
    # build bottom-up with abstract ids: ("L", i) learners, ("A", j) aggregators
    level: list[tuple[str, int]] = [("L", i) for i in range(n_learners)]
    kids: dict[tuple[str, int], list[tuple[str, int]]] = {}
    n_agg = 0
    while len(level) > k or n_agg == 0:
        upper = []
        for start in range(0, len(level), k):
            node = ("A", n_agg)
            n_agg += 1
            kids[node] = level[start : start + k]
            upper.append(node)
        level = upper
    order: list[tuple[str, int]] = []

    def visit(node: tuple[str, int]) -> None:
        order.append(node)
        for child in kids.get(node, []):
            visit(child)

    for top in level:
        visit(top)
    first = len(servers) + 2
    rank_of = {node: first + i for i, node in enumerate(order)}
    leaves = [(a, cs) for a, cs in kids.items() if all(c[0] == "L" for c in cs)]
    if nodes is not None and not all(
        nodes[rank_of[c]] == nodes[rank_of[a]] for a, cs in leaves for c in cs
    ):
        rank_of = place_by_node(order, leaves, range(first, world_size), nodes)
    parent = {rank_of[c]: rank_of[a] for a, cs in kids.items() for c in cs}
    learners = tuple(rank_of[("L", i)] for i in range(n_learners))
    aggregators = tuple(sorted(rank_of[("A", j)] for j in range(n_agg)))
    stats = len(servers)
    return Layout(world_size, servers, stats, stats + 1, learners, aggregators, parent)


def place_by_node(
    order: list[tuple[str, int]],
    leaves: list[tuple[tuple[str, int], list[tuple[str, int]]]],
    free_ranks: Sequence[int],
    nodes: Sequence[int],
) -> dict[tuple[str, int], int]:
    """Ranks for the tree's nodes so that each leaf aggregator shares its learners' node.

    Leaf groups (an aggregator and its learners) go whole, in depth-first order, to the first
    node with room for them (the node with the most room when none has enough: the group is
    then split across nodes as little as this greedy pass can); the upper aggregators take the
    ranks left over.
    """
    free: dict[int, list[int]] = {}
    for r in free_ranks:
        free.setdefault(nodes[r], []).append(r)
    rank_of: dict[tuple[str, int], int] = {}
    for agg, kids in leaves:
        group = [agg, *kids]
        while group:
            room = [n for n in free if len(free[n]) >= len(group)]
            node = room[0] if room else max(free, key=lambda n: len(free[n]))
            take, free[node] = free[node][: len(group)], free[node][len(group) :]
            rank_of.update(zip(group, take, strict=False))
            group = group[len(take) :]
            if not free[node]:
                del free[node]
    rest = sorted(r for ranks in free.values() for r in ranks)
    upper = [n for n in order if n not in rank_of]
    rank_of.update(zip(upper, rest, strict=True))
    return rank_of


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
    one slice of memory, so a whole-shard operation is a single buffer. With
    ``n_servers = 0`` (learners only) every block's shard is ``NO_SHARD``.
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
    return [
        Block(i, bounds[i], bounds[i + 1], i * n_servers // n_blocks if n_servers else NO_SHARD)
        for i in range(n_blocks)
    ]
