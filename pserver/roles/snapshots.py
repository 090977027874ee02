"""A shard block's model snapshots on their way to the statistics server (tests at epoch ends).

Never waits for the statistics server: while the previous snapshot of the block is still on its
way, the next waits in a queue of ``snapshot_queue()`` host copies; with the queue full, that
epoch's snapshot is skipped (counted here, and the statistics server records the untested
epoch). The final snapshot is never skipped: ``drain`` sends it after the others, as the block
no longer changes once training is over. Host memory: at most 64 MiB of queued copies per shard
(or one copy of a larger shard), plus the snapshot in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from pserver.comm.doorbell import ring
from pserver.comm.waiting import Waiter
from pserver.comm.wire import Header, Tag, header_buffer, model_aux

if TYPE_CHECKING:
    from pserver.comm.backend import Backend

# model snapshots a block may queue while one is on its way to statistics: as many as fit in
# SNAPSHOT_QUEUE_BYTES of host copies per shard, between 1 and SNAPSHOT_QUEUE_MAX
SNAPSHOT_QUEUE_MAX = 8
SNAPSHOT_QUEUE_BYTES = 64 << 20


def snapshot_queue(shard_bytes: int) -> int:
    """Queued snapshots per block for a shard of ``shard_bytes``: 8 for small models, one for a
    model whose shard exceeds 64 MiB (a tiny model's epochs end faster than a loaded
    statistics server tests them; a large one's take long enough for one to be plenty)."""
    return max(1, min(SNAPSHOT_QUEUE_MAX, SNAPSHOT_QUEUE_BYTES // max(shard_bytes, 1)))


@dataclass(frozen=True)
class StatsLink:
    """What the snapshots of a rank read of its run: the statistics channel and the
    statistics server's rank, this rank (the headers' sender), ``run.epochs`` (a snapshot of
    the last epoch is the final one) and the backend that copies the model to the host."""

    channel: MPI.Comm
    stats: int
    rank: int
    epochs: int
    backend: Backend


class Snapshots:
    """The snapshots of one block: the one in flight, the queue, the deferred final one."""

    def __init__(self, link: StatsLink, block: int, size: int, dtype: Any, depth: int) -> None:
        self.link, self.index, self.depth = link, block, depth
        self.buf = np.empty(size, dtype=dtype)  # on the host: stats stay off the GPU
        self.reqs: list[MPI.Request] = []  # header and payload in flight
        self.hdr: Any = None  # the header those sends read
        self.queued: list[tuple[int, int, Any]] = []  # (epoch, ts, host copy)
        self.spare: list[Any] = []  # host buffers for queued snapshots
        self.final_epoch = 0  # the final snapshot, deferred to ``drain`` behind the others
        self.skipped = 0

    def send(self, w: Any, epoch: int, ts: int) -> None:
        """Copy ``w`` (timestamp ``ts``) for the test of ``epoch``; the sends overlap later
        updates (see the module's rule)."""
        self.advance()
        if not self.reqs:
            self.link.backend.copy_to_host(w, self.buf)
            self.post(epoch, ts, self.buf)
        elif epoch >= self.link.epochs:
            self.final_epoch = epoch
        elif len(self.queued) < self.depth:
            buf = self.spare.pop() if self.spare else np.empty_like(self.buf)
            self.link.backend.copy_to_host(w, buf)
            self.queued.append((epoch, ts, buf))
        else:
            self.skipped += 1

    def advance(self) -> None:
        """Post the next queued snapshot once the one in flight has arrived (never waits)."""
        if self.reqs and MPI.Request.Testall(self.reqs):
            self.reqs = []
        if self.queued and not self.reqs:
            self.spare.append(self.buf)
            epoch, ts, buf = self.queued.pop(0)
            self.post(epoch, ts, buf)

    def post(self, epoch: int, ts: int, buf: Any) -> None:
        if self.hdr is None:
            self.hdr = header_buffer()[0]
        Header(Tag.MODEL, self.index, ts, self.link.rank, model_aux(epoch)).pack(self.hdr)
        stats, ch = self.link.stats, self.link.channel
        # synchronous: "in flight" means not yet matched, so the queue bounds what MPI holds
        # for the statistics server too (see pserver.comm.records on MPICH's eager cells)
        self.buf = buf
        self.reqs = [ch.Issend(self.hdr, stats, Tag.MODEL), ch.Issend(buf, stats, Tag.MODEL)]
        ring(stats)  # the statistics server sleeps on its doorbell

    def drain(self, w: Any, ts: int, waiter: Waiter) -> None:
        """End of the run: every queued snapshot, then the final one (waiting is fine now)."""
        what = "the statistics server to take a model snapshot"
        while self.queued:
            waiter.waitall(self.reqs, what)
            self.advance()
        if self.final_epoch:
            waiter.waitall(self.reqs, what)
            self.link.backend.copy_to_host(w, self.buf)
            self.post(self.final_epoch, ts, self.buf)
        waiter.waitall(self.reqs, what)
        self.reqs.clear()
