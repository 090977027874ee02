"""Collectives among the learners: the learners' communicator and a bucketed non-blocking
allreduce (ADPSGD's ring schedule is ``pserver.protocols.ring``).

The learners-only strategies (SYNC and HYBRID allreduce gradients or weights, ADPSGD averages
with a ring neighbour) run these on the **learners' communicator**, built once at start by
:func:`learner_comm` (collective on every rank of the world, before validation, as the node
split of :func:`pserver.runtime.context.local_rank` is); it never includes the servers, the data and
statistics ranks or the aggregators, so a collective of the learners cannot wait on them.

Every call is non-blocking and returns a handle: ``start(...) -> handle``, then
``handle.wait(what)`` (or ``handle.test()`` between other work). Waits go through the
:class:`~pserver.comm.waiting.Waiter`'s back-off: a blocking ``MPI_Allreduce`` busy-polls in
MPICH and would take a core from the learners that share a node while one of them is late.
MPICH progresses a non-blocking collective only inside MPI calls, so the waiting rank's tests
are what moves it on. A wait therefore polls at its shortest sleep (``poll_min``) for as long as
the operation is expected to take (:class:`pserver.comm.transfer_time.TransferClock`: twice its
bytes
over the best bandwidth of the last operations), then backs off as every wait does, to at most
``poll_max`` between tests: peers on time find every step tested promptly, and a rank kept
waiting by a late peer polls tightly only for that window, then sleeps.

``allreduce`` sums an array in place, cut into buckets of ``bucket_mib`` MiB, each its own
``Iallreduce(IN_PLACE)``; up to ``in_flight`` buckets are posted at once and the next one is
posted as the oldest completes (every rank posts them in the same order, as MPI requires of
collectives). GPU arrays are staged through the backend's pinned host buffers
(:class:`pserver.comm.backend.StagingBuffers`, one per bucket, allocated once) unless MPI is
CUDA-aware (:func:`pserver.comm.payload.staged`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from pserver.comm.backend import Backend, StagingBuffers
from pserver.comm.payload import staged
from pserver.comm.transfer_time import TIGHT_FACTOR, TransferClock
from pserver.comm.waiting import Waiter

DEFAULT_BUCKET_MIB = 16.0  # docs/architecture.md, "Collectives among the learners"
DEFAULT_IN_FLIGHT = 4
T = TypeVar("T")


def learner_comm(world: MPI.Comm, learners: Sequence[int]) -> MPI.Comm | None:
    """The learners' communicator (ranks in the order of ``learners``); None on other ranks.

    Collective over ``world``: every rank must call it once, with the same ``learners``, before
    anything that may fail on one rank (a rank that is not a learner passes ``MPI.UNDEFINED`` as
    its colour). Called in :func:`pserver.job.cli.main` right after the node split.
    """
    rank = world.Get_rank()
    member = rank in learners
    key = learners.index(rank) if member else 0
    comm = world.Split(0 if member else MPI.UNDEFINED, key)
    return None if comm == MPI.COMM_NULL else comm


def buckets(n: int, itemsize: int, bucket_mib: float) -> list[tuple[int, int]]:
    """``[start, stop)`` element ranges of at most ``bucket_mib`` MiB covering ``n`` elements
    (the last one shorter when ``n`` does not divide); one empty bucket for ``n = 0``."""
    if bucket_mib <= 0:
        raise ValueError(f"bucket size must be > 0 MiB, not {bucket_mib}")
    step = max(1, int(bucket_mib * 2**20) // itemsize)
    return [(i, min(i + step, n)) for i in range(0, n, step)] or [(0, 0)]


class Handle:
    """One started operation: ``test()`` moves it on and says whether it is complete,
    ``wait(what)`` returns once it is (with the Waiter's back-off and stall report)."""

    def __init__(self, waiter: Waiter, step: Callable[[], bool], what: str) -> None:
        self._waiter, self._step, self.what = waiter, step, what
        self.done = False
        self.progress = 0  # parts completed so far (buckets); a wait restarts its back-off
        self.tight_until = 0.0  # time.monotonic() until which a wait polls at its shortest

    def test(self) -> bool:
        if not self.done:
            self.done = self._step()
        return self.done

    def wait(self, what: str | None = None) -> None:
        """Back off as the Waiter does, restarting from its shortest sleep whenever a part
        completes: a late peer still finds this rank asleep (the sleeps grow to ``poll_max``
        while nothing moves), but once the parts flow the next one is tested for promptly, so
        a bucket's latency is not set by a sleep grown during the previous ones. Until
        ``tight_until`` (the operation's expected end) the sleeps stay at the shortest."""
        while not self.test():
            seen, tight = self.progress, self.tight_until - time.monotonic()
            done = lambda s=seen: self.test() or self.progress != s  # noqa: E731
            self._waiter.until(done, what or self.what, tight)


class Allreducer:
    """In-place sums of ``n``-element arrays of ``dtype`` over ``comm``, bucketed.

    One operation at a time per object (its staging buffers are reused); every rank of ``comm``
    must start the same sequence of operations with the same ``n``, ``dtype`` and buckets.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        backend: Backend,
        waiter: Waiter,
        n: int,
        dtype: Any,
        *,
        bucket_mib: float = DEFAULT_BUCKET_MIB,
        in_flight: int = DEFAULT_IN_FLIGHT,
        staging: str = "auto",
        tight_factor: float = TIGHT_FACTOR,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, not {in_flight}")
        self.comm, self.backend, self.waiter = comm, backend, waiter
        self.n, self.in_flight = n, in_flight
        self.nbytes = n * np.dtype(dtype).itemsize
        self.clock = TransferClock(tight_factor)  # how long this sum takes: the tight window
        self.buckets = buckets(n, np.dtype(dtype).itemsize, bucket_mib)
        sizes = [b - a for a, b in self.buckets]
        self.host = StagingBuffers(backend, sizes, dtype) if staged(backend, staging) else None
        self._busy: Handle | None = None

    def start(self, array: Any) -> Handle:
        """Start summing the contiguous 1-D ``array`` over ``comm`` in place."""
        if array.size != self.n or array.ndim != 1:
            raise ValueError(f"allreduce of {self.n} elements got an array of shape {array.shape}")
        if self._busy is not None and not self._busy.done:
            raise RuntimeError("allreduce started while the previous one is still in flight")
        if self.host is None:
            self.backend.synchronize()  # MPI must not read a device buffer a kernel still writes
        todo = deque(range(len(self.buckets)))
        posted: deque[tuple[int, MPI.Request]] = deque()
        t0 = time.monotonic()

        def step() -> bool:
            while posted and posted[0][1].Test():  # collectives complete in the order posted
                self._arrived(posted.popleft()[0], array)
                handle.progress += 1
            while todo and len(posted) < self.in_flight:
                i = todo.popleft()
                posted.append((i, self._post(i, array)))
            if posted:
                return False
            self.clock.observe(self.nbytes, time.monotonic() - t0)
            return True

        # a learner's loss (ULFM) ends the sum with CollectiveLost, never as a false completion
        checked = fail_fast(self.waiter, step)
        self._busy = handle = Handle(self.waiter, checked, f"an allreduce of {self.n} elements")
        handle.tight_until = t0 + self.clock.window(self.nbytes)
        handle.test()  # posts the first buckets
        return handle

    def rebind(self, comm: MPI.Comm) -> None:
        """Sum over ``comm`` from now on (the learners' communicator shrunk after a loss);
        the operation that failed is dropped (its buckets may hold partial sums)."""
        self.comm, self._busy = comm, None

    def _post(self, i: int, array: Any) -> MPI.Request:
        a, b = self.buckets[i]
        buf = self.host.to_host(i, array[a:b]) if self.host is not None else array[a:b]
        return self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def _arrived(self, i: int, array: Any) -> None:
        if self.host is not None:
            a, b = self.buckets[i]
            self.host.from_host(i, array[a:b])



# -- a lost learner under Open MPI's ULFM (issue 22) ---------------------------------------------


class CollectiveLost(Exception):
    """A collective among the learners failed because a learner died (ULFM): the survivors
    regroup (``pserver.roles.allreduce.Regroup``) instead of ending the job.
    ``error``: the MPI error (``MPI_ERR_PROC_FAILED`` or ``MPI_ERR_REVOKED``)."""

    def __init__(self, error: MPI.Exception) -> None:
        super().__init__(str(error))
        self.error = error


def survivable(waiter: Waiter, error: BaseException) -> bool:
    """Whether ``error``, raised by a collective among the learners, is the loss of a learner
    this run survives: the run has departures (ULFM on, a strategy that survives) and MPI says
    a process failed, or another survivor revoked the communicator (it only does so after the
    loss of a learner, which this rank's own detector may not have seen yet). A failed rank
    that is not a learner is never survivable (``PeerLog.absorb``: the job ends naming it)."""
    from pserver.comm.departures import is_failure

    peers = waiter.peers
    if peers.departures is None or not isinstance(error, MPI.Exception) or not is_failure(error):
        return False
    if error.Get_error_class() == MPI.ERR_REVOKED:
        new, fatal = peers.departures.absorb()
        if fatal:
            peers.fatal = fatal
            return False
        return True
    return peers.absorb(error, waiter.log)


def fail_fast(waiter: Waiter, test: Callable[[], T]) -> Callable[[], T]:
    """``test`` (or a post) with a survivable failure raised as :class:`CollectiveLost`, so
    that the Waiter does not absorb it and test a failed collective again as if it had
    completed."""

    def checked() -> T:
        try:
            return test()
        except MPI.Exception as e:
            if survivable(waiter, e):
                raise CollectiveLost(e) from e
            raise

    return checked


class FailFastWaiter:
    """The :class:`~pserver.comm.waiting.Waiter` of a learners' collective (the drift check,
    the stop vote): its ``wait`` raises :class:`CollectiveLost` on a learner's loss; anything
    else is the Waiter's."""

    def __init__(self, waiter: Waiter) -> None:
        self._waiter = waiter

    def wait(self, request: MPI.Request, what: Callable[[], str] | str) -> None:
        self._waiter.until(fail_fast(self._waiter, request.Test), what)

    def post(self, start: Callable[[], T]) -> T:
        """Post a collective: on a communicator revoked after a loss, :class:`CollectiveLost`."""
        return fail_fast(self._waiter, start)()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._waiter, name)


def gone(old: MPI.Comm, new: MPI.Comm, world: MPI.Comm) -> list[int]:
    """The ranks of ``world`` in ``old`` but not in ``new`` (the learners a shrink left out)."""
    og, ng, wg = old.Get_group(), new.Get_group(), world.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(og, list(range(og.Get_size())), wg)
        kept = set(MPI.Group.Translate_ranks(ng, list(range(ng.Get_size())), wg))
    finally:
        for g in (og, ng, wg):
            g.Free()
    return sorted(int(r) for r in ranks if r not in kept)


def reconcile(applied: Sequence[int]) -> tuple[int, int, int]:
    """The survivors' agreement after a regroup, from each survivor's count of applied
    averages (in the shrunk communicator's rank order): ``(lo, hi, root)``.

    In lockstep the counts differ by at most one: a survivor cannot complete the sum of step
    ``k + 1`` before every survivor has started it, which each does only after completing the
    sum of step ``k``. A survivor at ``lo < hi`` failed in the sum of step ``lo`` that the
    others completed (the dead learner's contribution is in it): it takes that sum from
    ``root``, the first survivor at ``hi``, and applies it (with the old λ). Every survivor is
    then at ``hi``; the sum of step ``hi`` (in flight on some, on none when a drift check or
    the end agreement failed) is redone over the survivors alone: the dead learner's step
    ``hi`` is the only work lost. Pure: tested in ``tests/test_lost_learner.py``.
    """
    lo, hi = min(applied), max(applied)
    if hi - lo > 1:
        raise ValueError(f"lockstep learners applied {lo} and {hi} averages: they drifted apart")
    return lo, hi, list(applied).index(hi)
