"""Where a block's array meets MPI: the array itself, or a pinned host mirror of it.

On the CPU, and on a GPU with a CUDA-aware MPI, a payload goes to ``Isend``/``Irecv`` as it is
(after synchronizing the stream that produced it). With a GPU and an MPI that is not CUDA-aware,
it is staged through preallocated pinned host buffers, one per block and direction, so no
message allocates. ``comm.staging = "always"`` forces the staged path on the CPU too, which is
how it is tested without a GPU.
"""

from __future__ import annotations

from typing import Any

from pserver.comm.backend import Backend, StagingBuffers
from pserver.plan.topology import Block


def staged(backend: Backend, staging: str) -> bool:
    """Whether payloads go through host buffers (``comm.staging``: "auto", "always", "never")."""
    return staging == "always" or (staging == "auto" and backend.needs_staging)


class Payloads:
    def __init__(self, backend: Backend, blocks: list[Block], dtype: Any, staging: str) -> None:
        self.backend = backend
        self.staged = staged(backend, staging)
        self.slot = {b.index: i for i, b in enumerate(blocks)}
        sizes = [b.size for b in blocks]
        self.inbox = StagingBuffers(backend, sizes, dtype) if self.staged else None
        self.outbox = StagingBuffers(backend, sizes, dtype) if self.staged else None
        self.versions: dict[tuple[int, int], int] = {}  # (block, version) -> outbox buffer

    def outgoing(self, block: int, array: Any) -> Any:
        """The buffer to hand to ``Isend`` for ``array`` (complete when this returns)."""
        if self.outbox is not None:
            return self.outbox.to_host(self.slot[block], array)
        self.backend.synchronize()  # MPI must not read a device buffer a kernel still writes
        return array

    def outgoing_version(self, block: int, version: int, array: Any) -> Any:
        """Like :meth:`outgoing`, staged into the block's host buffer number ``version``.

        Sends of one version may still read its buffer while the next one is staged
        (``pserver.protocols.versions``): each version has its own host buffer, allocated on first
        use.
        """
        if self.outbox is None:
            return self.outgoing(block, array)
        key = (block, version)
        if key not in self.versions:
            fresh = version == 0
            self.versions[key] = self.slot[block] if fresh else self.outbox.add(array.size)
        return self.outbox.to_host(self.versions[key], array)

    def incoming(self, block: int, array: Any) -> Any:
        """The buffer to post ``Irecv`` into for ``array``."""
        return self.inbox.host(self.slot[block]) if self.inbox is not None else array

    def arrived(self, block: int, array: Any) -> None:
        """Finish a completed receive: move a staged payload into ``array``."""
        if self.inbox is not None:
            self.inbox.from_host(self.slot[block], array)
