"""ADPSGD's learner exchange (IBM paper §3, Fig. 3b, Fig. 4): average with a ring neighbour.

The schedule, its liveness and termination arguments and the atomicity condition are in
:mod:`pserver.protocols.ring`; this module moves the bytes. One :class:`Gossip` per learner owns its
model ``w`` and a :class:`~pserver.comm.engine.CommEngine` whose ``progress()`` drives the
exchanges: in a communication thread (``threaded``, the paper's design: a receiver answers while
its main thread computes; the trainer's exchange, ``pserver.roles.gossip_exchange``, uses it in
every ``comm.mode``) or, without one, inside this learner's waits and once per step (a receiver
then answers at its step boundaries only; tested by tests/gossip_prog.py). The thread ends at
:meth:`Gossip.close`; the goodbyes of :meth:`Gossip.finish` then drive progress in their own
waits.

Atomicity (the doubly stochastic mix, how it is guaranteed here): every read or write of ``w``
— the snapshot the gradient is computed on, the local update, the averages — holds the
engine's lock (``progress()`` always runs under it). A **sender** applies its next update only
once its previous exchange has completed (:meth:`Gossip.update` waits for it: Fig. 3b's
``pull_weights`` before ``apply``), so the model it sent is unchanged when the neighbour's
answer is averaged into it. A **receiver** receives the sender's model first, then, in one
``progress()`` call under the lock, copies its own model into the answer buffer and averages
the sender's into ``w``: no update of its own can fall between the model it answers with and
the one it keeps. Both sides compute ``(a + b)·0.5`` with the same two arrays (IEEE addition
commutes), so both hold the same average bit for bit, and the sum of the models is unchanged.

Wire (on the learners' communicator, tags below): a gossip header is ``[kind, step, clock…]``
(int64; :class:`pserver.comm.wire.GossipKind` EXCHANGE / ANSWER / BYE, the sender's own step
count and its vector clock). Sender → receiver: header on ``GossipTag.CTRL``, model on
``GossipTag.MODEL``; receiver → sender: header on ``GossipTag.REPLY``, model on
``GossipTag.MODEL``. A receiver finds requests with a matched probe (never a posted
wildcard receive: docs/architecture.md, "Wildcard receives") and serves one at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver.comm.engine import CommEngine
from pserver.comm.waiting import Waiter
from pserver.comm.wire import GossipKind, GossipTag
from pserver.protocols.ring import (
    RECEIVER,
    SENDER,
    Goodbyes,
    GossipError,
    GossipLedger,
    Ring,
    VectorClock,
    average,
)  # fmt: skip

STAGE_OUT, STAGE_IN = 0, 1  # staging buffers (GPU arrays without CUDA-aware MPI)

Apply = Callable[[Any, Any, int], None]  # (w, g, own step) -> w updated in place


class Gossip:
    """One learner's side of ADPSGD (see the module docstring).

    ``apply(w, g, step)`` is the learner's local update rule. ``stage`` is None or a
    :class:`~pserver.comm.backend.StagingBuffers` with two buffers of ``w.size`` elements.
    ``start``: start the engine now (False: its owner calls ``engine.start()`` later, after
    restoring ``w`` and the clock from a checkpoint, before any exchange can be answered).
    """

    def __init__(
        self, comm: MPI.Comm, xp: Any, waiter: Waiter, w: Any, apply: Apply,
        *, threaded: bool, stage: Any = None, synchronize: Callable[[], None] = lambda: None,
        now: Callable[[], float] = time.perf_counter,
        activate: Callable[[], None] = lambda: None, start: bool = True,
    ) -> None:  # fmt: skip
        self.comm, self.xp, self.waiter, self.apply = comm, xp, waiter, apply
        self.me, n = comm.Get_rank(), comm.Get_size()
        # the stall report (PeerLog) names world ranks; the ring speaks in learner ranks
        world = MPI.COMM_WORLD.Get_group()
        self.world_rank = comm.Get_group().Translate_ranks(list(range(n)), world)
        self.ring = Ring(n)
        self.role = self.ring.role(self.me)
        self.w = w
        self.snap = xp.empty_like(w)  # what the gradient is computed on
        self.theirs = xp.empty_like(w)  # the neighbour's model
        self.answer = xp.empty_like(w)  # a receiver's answer (its model before averaging)
        self.stage, self.synchronize, self.now = stage, synchronize, now
        # CUDA's current device is per thread: each thread that runs progress() (staging
        # copies, averages) makes this rank's device current once (Backend.activate)
        self.activate, self.activated = activate, threading.local()
        self.book = GossipLedger(self.ring, self.me)  # clock, version, σ, exchange index
        self.engine = CommEngine(self.progress, waiter, threaded)
        self.lock: threading.Condition = self.engine.lock
        self.nbytes = int(w.nbytes)
        self.rows: list[dict[str, Any]] = []  # ``exchanges`` rows, taken by the main thread
        self.sigma_rows: list[dict[str, Any]] = []  # ``staleness`` rows (main thread only)
        # header buffers: [kind, step, clock...]
        self.hdr_out = np.zeros(2 + n, dtype=np.int64)
        self.hdr_in = np.zeros(2 + n, dtype=np.int64)
        # a sender's exchange in flight: partner, requests, start time
        self.pending: tuple[int, list[MPI.Request], float] | None = None
        self.byes: list[MPI.Request] = []
        # a receiver's request being served
        self.goodbyes = Goodbyes(self.ring, self.me) if self.role == RECEIVER else None
        self.serving: tuple[int, str, list[MPI.Request], float] | None = None
        self.t0 = time.perf_counter()
        if start:  # else the owner starts it once it has restored a checkpoint's state
            self.engine.start()

    # the book's state under the names the checkpoint drivers use (pserver.ckpt.drivers.gossip)
    @property
    def clock(self) -> VectorClock:
        return self.book.clock

    @property
    def k(self) -> int:
        return self.book.k

    @k.setter
    def k(self, value: int) -> None:
        self.book.k = value

    @property
    def exchanged(self) -> int:
        return self.book.exchanged

    @exchanged.setter
    def exchanged(self, value: int) -> None:
        self.book.exchanged = value

    @property
    def snap_version(self) -> int:
        return self.book.snap_version

    # -- the main thread -----------------------------------------------------------------------

    def snapshot(self) -> Any:
        """A copy of ``w`` to compute the next gradient on (answers stay possible meanwhile)."""
        with self.lock:
            if not self.engine.threaded:
                self.progress()  # a receiver without a thread answers at its step boundaries
            self.xp.copyto(self.snap, self.w)
            self.book.snapshot()
        return self.snap

    def version(self) -> int:
        """The version of ``w``: the updates applied to it so far, local steps and averages
        (docs/stats.md, *Staleness σ*; under the lock)."""
        return self.book.version()

    def update(self, g: Any) -> float:
        """Apply ``g`` to ``w`` (after the previous exchange completed, for a sender), then a
        sender starts its next exchange. Returns the seconds blocked on the previous one."""
        waited = self.wait_exchange()
        with self.lock:
            # σ of this gradient: the averages mixed into w since its snapshot (GossipLedger)
            version, sigma = self.book.gradient()
            self.sigma_rows.append(
                dict(
                    learner=self.me, owner=self.me, version=version, staleness=sigma,
                    time=self.now(),
                )
            )  # fmt: skip
            self.apply(self.w, g, self.clock.own)
            partner = self.book.stepped()
            if partner is not None:  # a sender: exchange with the schedule's neighbour
                self.start(partner)
        return waited

    def wait_exchange(self) -> float:
        if self.role != SENDER:
            return 0.0
        return self.engine.wait(
            lambda: self.pending is None, f"the answer of learner {self.partner_name()}"
        )

    def partner_name(self) -> str:
        return str(self.pending[0]) if self.pending is not None else "none"

    def close(self) -> None:
        """Stop the communication thread (the end of the run drives progress itself)."""
        self.engine.close()
        if self.engine.error is not None:
            raise RuntimeError("the gossip communication thread failed") from self.engine.error

    def finish(self) -> None:
        """Goodbyes (``pserver.protocols.ring``, Termination): a sender's last exchange, then one
        BYE to each neighbour; a receiver answers until every neighbour has said goodbye."""
        self.engine.threaded = False  # the thread is stopped: waits drive progress
        if self.role == SENDER:
            self.wait_exchange()
            with self.lock:
                for j in self.ring.neighbours(self.me):
                    self.hdr_out[:2] = (GossipKind.BYE, self.clock.own)
                    self.hdr_out[2:] = self.clock.steps
                    # a copy per neighbour: Isend must not see the buffer change under it
                    self.byes.append(self.comm.Isend(self.hdr_out.copy(), j, GossipTag.CTRL))
            self.waiter.waitall(self.byes, "goodbyes to the neighbours to be delivered")
        else:
            assert self.goodbyes is not None
            self.engine.wait(
                lambda: self.goodbyes.done and self.serving is None,
                lambda: f"goodbyes of neighbours {sorted(self.goodbyes.expected)}",
            )

    # -- progress (under the lock) -------------------------------------------------------------

    def progress(self) -> bool:
        """Test what is in flight once; True when something completed."""
        if not getattr(self.activated, "done", False):
            self.activate()
            self.activated.done = True
        return self.sender_progress() if self.role == SENDER else self.receiver_progress()

    def start(self, partner: int) -> None:
        """Send our model to ``partner`` with our header; post the receives of its answer."""
        self.hdr_out[:2] = (GossipKind.EXCHANGE, self.clock.own)
        self.hdr_out[2:] = self.clock.steps
        out = self.stage.to_host(STAGE_OUT, self.w) if self.stage is not None else self.w
        into = self.stage.host(STAGE_IN) if self.stage is not None else self.theirs
        if self.stage is None:
            self.synchronize()  # MPI must not read a device buffer a kernel still writes
        reqs = [
            self.comm.Irecv(self.hdr_in, partner, GossipTag.REPLY),
            self.comm.Irecv(into, partner, GossipTag.MODEL),
            self.comm.Isend(self.hdr_out, partner, GossipTag.CTRL),
            self.comm.Isend(out, partner, GossipTag.MODEL),
        ]
        self.pending = (partner, reqs, time.perf_counter())

    def sender_progress(self) -> bool:
        if self.pending is None:
            return False
        partner, reqs, started = self.pending
        if not MPI.Request.Testall(reqs):
            return False
        if int(self.hdr_in[0]) != GossipKind.ANSWER:
            raise GossipError(f"learner {self.me}: got kind {int(self.hdr_in[0])}, not an answer")
        if self.stage is not None:
            self.stage.from_host(STAGE_IN, self.theirs)
        average(self.xp, self.w, self.theirs)  # w is what we sent: no update since (update())
        self.mixed(partner, self.hdr_in, started)
        self.pending = None
        return True

    def receiver_progress(self) -> bool:
        if self.serving is not None:
            return self.serve()
        status = MPI.Status()
        msg = self.comm.Improbe(MPI.ANY_SOURCE, GossipTag.CTRL, status)
        if msg is None:
            return False
        sender = status.Get_source()
        msg.Recv(self.hdr_in)
        assert self.goodbyes is not None
        if int(self.hdr_in[0]) == GossipKind.BYE:
            self.goodbyes.bye(sender)
            return True
        if int(self.hdr_in[0]) != GossipKind.EXCHANGE:
            raise GossipError(f"learner {self.me}: got kind {int(self.hdr_in[0])} from {sender}")
        self.goodbyes.request(sender)
        into = self.stage.host(STAGE_IN) if self.stage is not None else self.theirs
        req = self.comm.Irecv(into, sender, GossipTag.MODEL)
        self.serving = (sender, "receiving", [req], time.perf_counter())
        self.serve()
        return True

    def serve(self) -> bool:
        """Move the request being served on: its model in, then (atomically) our answer out
        and the average kept; done once the answer has been delivered."""
        assert self.serving is not None
        sender, phase, reqs, started = self.serving
        if not MPI.Request.Testall(reqs):
            return False
        if phase == "receiving":
            if self.stage is not None:
                self.stage.from_host(STAGE_IN, self.theirs)
            self.xp.copyto(self.answer, self.w)  # the model we answer with ...
            average(self.xp, self.w, self.theirs)  # ... and the one we keep, in one region
            clock = self.hdr_in.copy()
            self.hdr_out[:2] = (GossipKind.ANSWER, self.clock.own)
            self.hdr_out[2:] = self.clock.steps
            self.mixed(sender, clock, started)
            out = self.answer
            if self.stage is not None:
                out = self.stage.to_host(STAGE_OUT, self.answer)
            else:
                self.synchronize()
            sends = [
                self.comm.Isend(self.hdr_out, sender, GossipTag.REPLY),
                self.comm.Isend(out, sender, GossipTag.MODEL),
            ]
            self.serving = (sender, "answering", sends, started)
            return True
        self.serving = None  # answer delivered: its buffers may take the next request
        return True

    def mixed(self, partner: int, hdr: np.ndarray, started: float) -> None:
        """Bookkeeping of one average: the ``exchanges`` row and the vector clock."""
        partner_step = int(hdr[1])
        step, partner_age = self.book.mixed(partner_step, hdr[2:])
        self.rows.append(  # docs/stats.md, exchanges/
            dict(
                learner=self.me,
                step=step,
                partner=partner,
                partner_age=partner_age,
                partner_step=partner_step,
                bytes=self.nbytes,
                wait_time=time.perf_counter() - started,
                time=self.now(),
            )
        )
        self.waiter.peers.note(self.world_rank[partner], f"its model of step {partner_step}")

    def take_rows(self) -> list[dict[str, Any]]:
        """The ``exchanges`` rows recorded since the last call."""
        with self.lock:
            rows, self.rows = self.rows, []
        return rows

    def take_staleness(self) -> list[dict[str, Any]]:
        """The ``staleness`` rows (one per applied gradient) since the last call."""
        rows, self.sigma_rows = self.sigma_rows, []
        return rows
