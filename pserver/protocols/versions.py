"""Versions of a block that pulls are served from, so an update never waits for a reader.

A weight send (``Isend``, or a shared-window copy acknowledged later) reads its buffer until
the receiver has taken it, and above MPI's eager size that happens only when the receiver calls
into MPI: a learner that computes for long, or is stopped, keeps its send open. Updating the
buffer in place would have to wait for it. Instead the buffer a send reads is *pinned* until the
send completes, and a write (an update, a staging copy, a new model arriving) goes to a buffer
that nobody reads: the current one if it is unpinned (in place, no copy), else a spare one
(copy-on-write). This module is the bookkeeping alone — which buffer is current, who reads
which, where the next write goes — with no MPI and no arrays; the drivers own the buffers.

The memory bound: at most ``limit`` buffers per block, allocated on demand (the pool starts
with one and grows only when a write finds every allocated buffer pinned). The rule that keeps
writes from ever waiting (:meth:`VersionPool.may_pin`): the current buffer is pinned by a new
reader only while at most ``limit - 2`` *other* buffers are occupied (pinned, or reserved for a
write in progress). So whenever the current buffer is pinned, at least one other buffer is free
or may still be allocated, and a write always has a target. When the rule refuses, the driver
holds that *pull* until a pinned buffer is released — never the update.

Liveness of a held pull: each occupied buffer is pinned by sends to receivers that posted their
receive before asking (so each completes once its receiver calls into MPI, which a live receiver
does while it waits for its own reply), or reserved by a write that ends without waiting. Once
one is released, :meth:`may_pin` holds again. With ``limit >= 1 + readers`` (one pin per reader
at a time, plus the current buffer) the rule refuses only for a moment: when a reader's new
pull arrives before the shard has seen its previous send complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Write:
    """Where the next write of a block goes.

    ``target`` is a buffer index (``>=`` the driver's buffer count: a new buffer to create, see
    :attr:`VersionPool.allocated`); ``copy_from`` the buffer whose contents must first be copied
    into it (copy-on-write: the current, pinned one), or None when writing in place or when the
    write replaces the whole contents anyway.
    """

    target: int
    copy_from: int | None


@dataclass
class VersionPool:
    """Which of a block's buffers is current, who reads which, and where a write may go.

    ``limit >= 2``: buffers the block may have at once (``comm.versions``).
    """

    limit: int
    allocated: int = 1
    current: int = 0
    pins: dict[int, int] = field(default_factory=dict)  # ticket -> buffer it reads
    reserved: set[int] = field(default_factory=set)  # buffers a write in progress targets
    high_water: int = 1  # most buffers ever allocated (for the statistics)
    writes: int = 0  # calls of write(), and those that had to copy-on-write
    copies: int = 0
    _next_ticket: int = 0

    def __post_init__(self) -> None:
        if self.limit < 2:
            raise ValueError(f"a version pool needs at least 2 buffers, got {self.limit}")

    # -- readers -----------------------------------------------------------------------------

    def readers(self, buffer: int) -> int:
        """How many outstanding sends read ``buffer``."""
        return sum(1 for b in self.pins.values() if b == buffer)

    def occupied(self) -> set[int]:
        """Buffers that a write may not target: pinned or reserved."""
        return set(self.pins.values()) | self.reserved

    def may_pin(self) -> bool:
        """Whether a new reader may be served from the current buffer now.

        True when the current buffer is already pinned (one more reader changes nothing) or when,
        once it is pinned, a write would still find a target: at most ``limit - 2`` other
        buffers occupied.
        """
        others = self.occupied() - {self.current}
        return self.current in self.pins.values() or len(others) <= self.limit - 2

    def pin(self) -> int:
        """A new reader of the current buffer; returns its ticket for :meth:`release`."""
        if not self.may_pin():
            raise RuntimeError("pin refused: no buffer would be left for the next write")
        ticket = self._next_ticket
        self._next_ticket += 1
        self.pins[ticket] = self.current
        return ticket

    def release(self, ticket: int) -> None:
        """The send of ``ticket`` completed: it no longer reads its buffer."""
        del self.pins[ticket]

    # -- writers -----------------------------------------------------------------------------

    def free(self) -> int | None:
        """An allocated buffer that is neither current nor occupied, or None."""
        busy = self.occupied() | {self.current}
        return next((i for i in range(self.allocated) if i not in busy), None)

    def write(self, copy: bool = True) -> Write:
        """Where to write the current buffer's next contents, and make that buffer current.

        In place when nobody reads the current buffer; else a free buffer (allocated if need
        be), into which the current contents are copied first when ``copy`` (an update reads
        the old weights; a staging copy or a received model replaces them whole).
        """
        old = self.current
        self.writes += 1
        if old not in self.pins.values() and old not in self.reserved:
            return Write(old, None)
        target = self.reserve()
        if target is None:  # may_pin's rule makes this unreachable; say so loudly if not
            raise RuntimeError(f"no free buffer among {self.limit} for a write")
        self.publish(target)
        self.copies += copy
        return Write(target, old if copy else None)

    def reserve(self) -> int | None:
        """A buffer for a write that completes later (a receive): not current, not occupied.

        Allocates one when none is free and the limit allows; None when the limit is reached.
        """
        target = self.free()
        if target is None:
            if self.allocated >= self.limit:
                return None
            target = self.allocated
            self.allocated += 1
            self.high_water = max(self.high_water, self.allocated)
        self.reserved.add(target)
        return target

    def publish(self, buffer: int) -> None:
        """The write into ``buffer`` is complete: it becomes the current buffer."""
        self.reserved.discard(buffer)
        self.current = buffer


def release_completed(sends: list[tuple[Any, int]], pool: VersionPool) -> bool:
    """Drop the ``(request, ticket)`` pairs whose send has completed (``request.Test()``) from
    ``sends`` and release their pins in ``pool``; True if any did. The one place a pinned
    send's version goes back: shards, aggregators and relaying learners all call it."""
    done = [(req, ticket) for req, ticket in sends if req.Test()]
    for item in done:
        sends.remove(item)
        pool.release(item[1])
    return bool(done)
