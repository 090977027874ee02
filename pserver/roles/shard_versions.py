"""The versions of one shard block that pulls read, and the sends reading them.

The bookkeeping is ``pserver.protocols.versions.VersionPool`` (pure); this adds the buffers, the MPI
requests that pin them, and the two writes: an update's copy-on-write (``new_version``) and,
with host staging, the staged copy weight sends read (``stage``). Neither ever waits for a
receiver longer than one copy takes (see ``new_version``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from pserver.comm.waiting import ABSORB_RETRIES, Waiter
from pserver.protocols.versions import VersionPool, release_completed


class ServedVersions:
    """One block's weight versions (``bufs``, indexed as in ``pool``) and what pins them."""

    def __init__(
        self, index: int, limit: int, bufs: list[Any], buffer: Callable[[int], Any], xp: Any
    ) -> None:
        """``buffer(v)`` allocates version ``v`` (in the shared window with shm)."""
        self.index, self.bufs, self.buffer, self.xp = index, bufs, buffer, xp
        self.pool = VersionPool(limit)
        self.inflight: list[tuple[MPI.Request, int]] = []  # (send, pool ticket)
        self.readers: dict[int, int] = {}  # learner -> ticket of the version it computes on
        self.staged_ts = -1  # timestamp of the staged (or device-synchronized) current version
        self.served_ts = -1  # PP-ASGD: timestamp of the prediction in the current version
        self.copy_cost = 0.0  # seconds the last copy-on-write of the block took
        # issue 22: whether an MPI error is a lost learner's, absorbed (PeerLog.absorb)
        self.absorb: Callable[[BaseException], bool] = lambda error: False

    @property
    def current(self) -> Any:
        return self.bufs[self.pool.current]

    def collect(self) -> bool:
        """Release the versions read by sends that have completed; True if any did.

        A send to a learner lost under ULFM completes in error: once ``absorb`` has taken the
        loss, the send counts as completed (its request is freed) and the test goes on."""
        for _ in range(ABSORB_RETRIES):
            try:
                return release_completed(self.inflight, self.pool)
            except MPI.Exception as error:
                if not self.absorb(error):
                    raise
        return release_completed(self.inflight, self.pool)

    def can_pin(self) -> bool:
        return self.pool.may_pin() or (self.collect() and self.pool.may_pin())

    def pin_send(self, req: MPI.Request) -> None:
        """``req`` reads the current version until it completes."""
        self.inflight.append((req, self.pool.pin()))

    def pin_reader(self, learner: int) -> None:
        """``learner`` computes on the current version in place until its next push."""
        if learner in self.readers:  # cannot happen (a push comes between): no leak
            self.pool.release(self.readers.pop(learner))
        self.readers[learner] = self.pool.pin()

    def unpin_reader(self, learner: int) -> None:
        """``learner`` pushed: it reads no version until answered."""
        if learner in self.readers:
            self.pool.release(self.readers.pop(learner))

    def new_version(self, waiter: Waiter, nbytes: int, fused: bool = False) -> tuple[Any, Any]:
        """(target, source): a buffer no send or learner reads, for the update to write, and
        the buffer holding the current weights it starts from (None: the target holds them —
        in place, or already copied).

        In place when every send of the current version has completed; else the weights are
        copied to a free version (allocated up to ``comm.versions``), which the pool's rule
        (``VersionPool.may_pin``) keeps whenever the current one is read. Sends to responsive
        receivers are given at most as long as that copy takes (the last one's duration; with
        ``fused``, an estimate from ``nbytes``) to complete first: driving them is work the shard
        does anyway, the copy is not. A stopped receiver thus delays an update by at most one
        copy's time, and only the first update after it stopped (later ones find its version
        no longer current). ``fused``: the update copies while it steps
        (``Updater.step_from``: one pass over memory), so the copy is left to it and the
        source returned.
        """
        self.give_sends(waiter, self.copy_cost or nbytes / 2e9)
        write = self.pool.write()
        while len(self.bufs) < self.pool.allocated:
            self.bufs.append(self.buffer(len(self.bufs)))
        target = self.bufs[write.target]
        if write.copy_from is None:
            return target, None
        if fused:
            return target, self.bufs[write.copy_from]
        started = time.perf_counter()
        self.xp.copyto(target, self.bufs[write.copy_from])
        self.copy_cost = time.perf_counter() - started
        return target, None

    def give_sends(self, waiter: Waiter, seconds: float) -> None:
        """Let the sends reading the current version complete, for at most ``seconds``; not
        when a learner computes on it (shm zero-copy: that takes a whole minibatch)."""
        self.collect()
        current = self.pool.current
        if self.pool.readers(current) == 0 or any(
            self.pool.pins.get(t) == current for t in self.readers.values()
        ):
            return
        deadline = time.perf_counter() + seconds

        def done() -> bool:
            self.collect()
            return self.pool.readers(current) == 0 or time.perf_counter() >= deadline

        waiter.until(done, lambda: f"weight sends of block {self.index} (bounded)")

    def stage(self, staged: Callable[[int], Any], ts: int) -> None:
        """A staged host copy of the weights, in a version no send reads (never waits):
        ``staged(v)`` writes it for version ``v`` and returns the buffer."""
        self.collect()
        write = self.pool.write(copy=False)
        buf = staged(write.target)
        if write.target == len(self.bufs):
            self.bufs.append(buf)
        self.staged_ts = ts

    def produce(self, fill: Callable[[Any], Any], ts: int) -> None:
        """A served model that is not w (PP-ASGD's prediction), written by ``fill(buffer)``
        into a version no send or learner reads (never waits: ``VersionPool.write``)."""
        self.collect()
        write = self.pool.write(copy=False)
        while len(self.bufs) <= write.target:
            self.bufs.append(self.buffer(len(self.bufs)))
        fill(self.bufs[write.target])
        self.served_ts = ts

    def drain(self, waiter: Waiter) -> None:
        waiter.waitall([r for r, _ in self.inflight], "weight sends to drain")
        self.inflight.clear()


def summary(pools: list[VersionPool]) -> str:
    """The log line on a shard's versions at the end of a run."""
    return (
        f"pulls served from at most {max(p.high_water for p in pools)} version(s) of a block "
        f"(bound {pools[0].limit}); {sum(p.copies for p in pools)} of "
        f"{sum(p.writes for p in pools)} writes copied a version still being sent"
    )
