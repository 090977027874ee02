"""The learner's I/O thread: prefetch minibatches from the data server while the learner computes.

Slots (preallocated feature and label buffers) circulate between two queues: the thread fills a
free slot and hands it over as ready; the learner hands it back once the gradient is computed.
Both sides block on the queues (condition variables), never on a polled flag; ``None`` in the
free queue is the stop sentinel.

A learners-only run ends at the data server (``pserver.roles.dataserver``): a request past its
quota is answered with an empty minibatch, after which :meth:`Prefetcher.get` returns None and
the thread fetches nothing more.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from pserver.comm.wire import Header, Tag, bye_aux, header_buffer

if TYPE_CHECKING:
    from pserver.comm.backend import Backend
    from pserver.comm.waiting import Waiter


class Slot:
    """Host buffers MPI receives into, and (on a GPU) device buffers the learner computes on."""

    def __init__(self, batch: int, n_features: int, backend: Any) -> None:
        self.X = np.empty((batch, n_features), dtype=np.float32)
        self.y = np.empty(batch, dtype=np.int64)
        self.backend = backend
        gpu = backend.is_gpu
        self.dev_X = backend.xp.empty(self.X.shape, self.X.dtype) if gpu else self.X
        self.dev_y = backend.xp.empty(self.y.shape, self.y.dtype) if gpu else self.y
        self.status = MPI.Status()  # of the labels' receive: zero labels is the data's end
        self.stop = False

    def on_device(self) -> tuple[Any, Any]:
        if self.dev_X is not self.X:
            self.backend.copy_from_host(self.X, self.dev_X)
            self.backend.copy_from_host(self.y, self.dev_y)
        return self.dev_X, self.dev_y


@dataclass(frozen=True)
class DataSource:
    """What a learner's prefetcher reads of its run: the I/O channel and the data server's
    rank, this rank (the requests' sender), the minibatch's shape (``data.batch_size``, the
    features), the slots in circulation (``data.prefetch``), the backend the learner computes
    on and the log."""

    comm: MPI.Comm
    data_rank: int
    rank: int
    batch: int
    n_features: int
    depth: int
    backend: Backend
    log: logging.Logger


class Prefetcher:
    def __init__(self, source: DataSource, waiter: Waiter) -> None:
        self.source = source
        self.comm = source.comm
        self.data_rank = source.data_rank
        self.waiter = waiter
        self.free: queue.Queue[Slot | None] = queue.Queue()
        self.ready: queue.Queue[Slot | BaseException] = queue.Queue()
        for _ in range(source.depth):
            self.free.put(Slot(source.batch, source.n_features, source.backend))
        self.current: Slot | None = None
        self.over = False  # the data server answered with its stop
        self.out = header_buffer()
        self.threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        if not self.threaded:
            source.log.warning("MPI gives no THREAD_MULTIPLE: minibatches are fetched inline")
        self.thread = threading.Thread(target=self.loop, name="prefetch", daemon=True)
        if self.threaded:
            self.thread.start()

    @property
    def waited(self) -> float:
        return self.waiter.waited

    def loop(self) -> None:
        try:
            while (slot := self.free.get()) is not None:
                self.fetch(slot)
                self.ready.put(slot)
                if slot.stop:  # nothing follows the data server's stop
                    break
        except BaseException as e:  # handed to the learner, which raises it on its own thread
            self.ready.put(e)

    def fetch(self, slot: Slot) -> None:
        reqs = [
            self.comm.Irecv(slot.X, self.data_rank, Tag.DATA_X),
            self.comm.Irecv(slot.y, self.data_rank, Tag.DATA_Y),
        ]
        hdr = Header(Tag.DATA_REQ, -1, -1, self.source.rank).pack(self.out[0])
        self.comm.Send(hdr, self.data_rank, Tag.DATA_REQ)
        statuses = [MPI.Status(), slot.status]
        self.waiter.until(
            lambda: MPI.Request.Testall(reqs, statuses),
            f"a minibatch from the data server (rank {self.data_rank})",
        )
        slot.stop = slot.status.Get_count(MPI.BYTE) == 0

    def get(self) -> tuple[Any, Any] | None:
        """The next minibatch as arrays of the learner's backend (blocks until one is ready);
        None once the data server has said the run's minibatches are all served."""
        if self.over:
            return None
        item = self.next_slot()
        if item.stop:
            self.over = True
            self.free.put(item)
            return None
        self.current = item
        return item.on_device()

    def next_slot(self) -> Slot:
        if not self.threaded:
            slot = self.free.get()
            assert slot is not None
            self.fetch(slot)
            self.ready.put(slot)
        item = self.ready.get()
        if isinstance(item, BaseException):
            raise RuntimeError("the prefetch thread failed") from item
        return item

    def release(self) -> None:
        if self.current is not None:
            self.free.put(self.current)
            self.current = None

    def close(self) -> None:
        """Stop the thread after the request it may have in flight (the data server answers it)."""
        self.free.put(None)
        if self.threaded:
            self.thread.join()

    def bye(self, consumed: int = -1) -> None:
        """Tell the data server this learner takes no more minibatches (after :meth:`close`),
        and how many of those it was served it computed on (the others go back to the stream
        at a checkpoint, ``pserver.roles.dataserver``); -1: unknown."""
        bye = Header(Tag.BYE, -1, -1, self.source.rank, bye_aux(consumed)).pack(self.out[0])
        self.comm.Send(bye, self.data_rank, Tag.BYE)
