"""Shared-memory payloads between a server shard and the learners on its node.

With ``comm.transport = "shm"`` every server shard allocates, in one MPI shared-memory window
over the ranks of its node, its weights and one gradient slot per learner of that node. Then:

* a learner computes its gradient straight into its slot (no send: with one shard the slot *is*
  its gradient buffer) and pushes only the header; the shard's update reads the slot in place
  (for SGD one BLAS ``axpy`` from the slot into the weights);
* a pull answered with weights is a header naming a version of the weights (the shard keeps
  ``comm.versions`` of them here, by default 1 + learners of its node); the learner copies that
  version of the block out of the window and acknowledges with an empty message on the ``ack``
  communicator. Until then the version is pinned, as by an ``Isend``
  (``pserver.protocols.versions``):
  the shard's next update goes to another version, so a stopped learner stops nobody;
* with one shard holding the model in one block, not even that copy is made: the learner
  computes on the version the reply names, in place, until its next push. The shard updates the
  current version in place when no learner is computing on it, else first copies it to a version
  nobody reads (there always is one), so a learner's weights never change under it.

Each update thus moves the model through memory twice (update, copy out), or once with versions,
instead of three times (copy in, update, copy out), which is where a two-sided server's ceiling
comes from (docs/performance.md, "A two-sided server's memory ceiling"). The slot may be
overwritten by the learner's next compute only after the learner's pull was answered, and the
shard answers a pull only after the push before it was handled (non-overtaking on ``ctrl``);
that is why shm needs blocking mode and full pulls (validated in ``config.validate``). Learners
on other nodes keep using messages.

Memory ordering: the window is in a passive-target epoch (``Lock_all``) for the whole run; a
writer calls ``Win.Sync`` before the message that publishes its writes and a reader calls it
after that message arrived, as MPI's unified memory model asks.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from pserver.plan.topology import Block, Layout


def plan(
    layout: Layout, blocks: list[Block], node_of: list[int], node: int, versions: int = 0
) -> tuple[dict[int, list[int]], dict[int, int]]:
    """For the shards on ``node``: their learners on that node, and their weight versions.

    Slot i of a shard belongs to the i-th of its local learners (rank order). A shard keeps
    ``versions`` (``comm.versions``) versions of its weights, by default one more than its
    local learners: each learner reads at most one version at a time (a copy it has not
    acknowledged, or the version it computes on), so a free version always exists for an update
    (``pserver.protocols.versions``) and no update waits for a learner of the node.
    """
    local = {
        s: [lr for lr in layout.learners if node_of[lr] == node]
        for s in layout.servers
        if node_of[s] == node
    }
    return local, {s: versions or 1 + len(ls) for s, ls in local.items()}


def window_bytes(
    layout: Layout, blocks: list[Block], node_of: list[int], itemsize: int, versions: int = 0
) -> int:
    """Shared memory the window of this rank's node will take (for the check before training)."""
    total = 0
    for node in set(node_of):
        local, counts = plan(layout, blocks, node_of, node, versions)
        sizes = {s: sum(b.size for b in blocks if layout.servers[b.shard] == s) for s in local}
        total = max(total, sum(sizes[s] * (counts[s] + len(local[s])) for s in local))
    return total * itemsize


class SharedWindows:
    """The node's window, and views of the shards' weights and gradient slots in it."""

    def __init__(
        self,
        world: MPI.Comm,
        layout: Layout,
        blocks: list[Block],
        dtype: np.dtype,
        node_of: list[int],
        versions: int = 0,
    ) -> None:
        """Collective over ``world``: every rank calls it, in the same place of the start-up.

        ``node_of`` names the node of every rank (``Context.nodes``, from ``local_rank``);
        ``versions`` is ``comm.versions`` (0: one more than a shard's local learners).
        """
        rank = world.Get_rank()
        self.node = world.Split_type(MPI.COMM_TYPE_SHARED)
        self.node_ranks = self.node.allgather(rank)  # node rank -> world rank
        self.dtype = np.dtype(dtype)
        self.mine = node_of[rank]
        self.local, self.versions = plan(layout, blocks, node_of, self.mine, versions)
        self.single = len(layout.servers) == 1 and len(blocks) == 1
        self.shard_blocks = {
            s: [b for b in blocks if b.shard == i] for i, s in enumerate(layout.servers)
        }
        count = 0
        if rank in self.local:
            count = self.shard_size(rank) * (self.versions[rank] + len(self.local[rank]))
        itemsize = self.dtype.itemsize
        self.win = MPI.Win.Allocate_shared(count * itemsize, itemsize, comm=self.node)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.arrays: dict[int, np.ndarray] = {}
        for node_rank, server in enumerate(self.node_ranks):
            if server in self.local:
                buf, _ = self.win.Shared_query(node_rank)
                n = self.shard_size(server) * (self.versions[server] + len(self.local[server]))
                self.arrays[server] = np.frombuffer(buf, dtype=self.dtype, count=n)

    def shard_size(self, server: int) -> int:
        return sum(b.size for b in self.shard_blocks[server])

    def shares(self, server: int, learner: int) -> bool:
        """Whether ``learner`` and shard ``server`` exchange payloads through the window."""
        return learner in self.local.get(server, [])

    def _offset(self, server: int, b: Block) -> int:
        return b.start - self.shard_blocks[server][0].start

    def zero_copy(self, server: int) -> bool:
        """Whether learners compute on shard ``server``'s window versions without copying
        (one shard holding the model in one block: the learner's model *is* the block)."""
        return self.single and server in self.local

    def weights(self, server: int, b: Block, version: int = 0) -> np.ndarray:
        """Block ``b`` of version ``version`` of the weights shard ``server`` keeps here."""
        start = self.shard_size(server) * version + self._offset(server, b)
        return self.arrays[server][start : start + b.size]

    def slot(self, server: int, learner: int, b: Block | None = None) -> np.ndarray:
        """``learner``'s gradient slot at shard ``server``: block ``b``, or the whole shard."""
        n = self.shard_size(server)
        base = n * (self.versions[server] + self.local[server].index(learner))
        if b is None:
            return self.arrays[server][base : base + n]
        start = base + self._offset(server, b)
        return self.arrays[server][start : start + b.size]

    def sync(self) -> None:
        """Make this rank's window writes visible / see the others' (MPI_Win_sync)."""
        self.win.Sync()

    def free(self) -> None:
        """Collective over the node; after every rank stopped touching the window."""
        self.arrays.clear()
        self.win.Unlock_all()
        self.win.Free()
        self.node.Free()
