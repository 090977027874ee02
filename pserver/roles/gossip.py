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

A lost learner (issue 22, Open MPI's ULFM, ``pserver.comm.departures``). A survivor learns of
the death from a request with the dead learner that completes in error, from a wildcard probe
that fails, or from the communicator's list of failed processes (:meth:`Gossip.look`, at most
every ``LOOK_PERIOD`` s, also where no traffic goes). It then **breaks** (:meth:`Gossip.fail`):
it revokes the learners' communicator (and the epoch averages' one, ``on_break``), so every
survivor's next call on it fails too, and abandons what was in flight. An exchange whose
neighbour's model had not fully arrived is dropped and **the survivor keeps its own weights for
that step** (a sender averages only once the whole answer is in, a receiver only once the
whole request is); a receiver that had already averaged a fully received model keeps that
average (the mix of that one exchange is then not doubly stochastic: the sender's half was
lost, a bounded perturbation of the consensus, not a corrupt model). At its next step boundary
(the top of :meth:`Gossip.update`, or inside :meth:`Gossip.finish`'s waits) the survivor
**repairs** (:meth:`Gossip.repair`): ``MPI_Comm_shrink`` (blocking: Open MPI 5.0.11's
``Ishrink`` fails after a death) to the survivors, the ring of the survivors
(:meth:`pserver.protocols.ring.Ring.lose`, checked against the shrunk communicator's order),
its new role and neighbours, then ``on_repair`` (the epoch averages agree where to go on).

Liveness after a loss: every survivor reaches the shrink, and none waits forever for the dead
learner or for a survivor waiting for it. (1) Every survivor breaks: the revocation reaches all
of them, and every survivor calls the communicator while it trains (a receiver's probes, a
sender's exchange) or in every wait of its end (the goodbyes, the averages: each wait's
condition is "done or broken" and looks at the failed list). (2) Once broken, no wait of the
exchange stays blocked: the pending exchange and the request being served are dropped, so
``pending is None`` holds and the goodbye waits end on ``broken``. (3) A survivor that is still
training reaches its next step boundary after one minibatch (the data server serves whatever
the learners do), so every survivor calls the shrink, which completes among the survivors. The
new ring is bipartite (``pserver.protocols.ring``), so the argument there holds again; the
goodbyes of the old ring are void (its communicator is gone) and each survivor that had ended
says or awaits them again in the new ring. A second loss repeats this. Not covered: a learner
that dies inside the run's last collective (the final average), after some survivors completed
it and left, would leave the others' shrink waiting for them (a window of the average's
duration, milliseconds).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver.comm.departures import is_failure
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
LOOK_PERIOD = 0.2  # s between looks at the learners' communicator's failed processes


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
        self.learner = self.me  # this learner's id; ``me`` is its position in the ring
        self.ring = Ring(n)
        self.role = self.ring.role(self.me)
        self.world_rank = self.world_ranks()
        # a lost learner (module docstring): broken until repaired at a step boundary
        self.broken = False
        self.next_look = 0.0
        self.on_break: list[Callable[[], None]] = []  # revoke what else the learners share
        self.on_repair: list[Callable[[MPI.Comm], None]] = []  # collective, in this order
        self.w = w
        self.snap = xp.empty_like(w)  # what the gradient is computed on
        self.theirs = xp.empty_like(w)  # the neighbour's model
        self.answer = xp.empty_like(w)  # a receiver's answer (its model before averaging)
        self.stage, self.synchronize, self.now = stage, synchronize, now
        # CUDA's current device is per thread: each thread that runs progress() (staging
        # copies, averages) makes this rank's device current once (Backend.activate)
        self.activate, self.activated = activate, threading.local()
        # clock (over the learners of the run's start), version, σ, exchange index
        self.book = GossipLedger(self.ring, self.me)
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
        self.finished = False  # finish() is over (its goodbyes done in the current ring)
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

    def world_ranks(self) -> list[int]:
        """The stall report (PeerLog) names world ranks; the ring speaks in positions."""
        world = MPI.COMM_WORLD.Get_group()
        n = self.comm.Get_size()
        return list(self.comm.Get_group().Translate_ranks(list(range(n)), world))

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
        if self.broken:
            self.repair()  # a step boundary: no exchange of this learner is in flight
        with self.lock:
            # σ of this gradient: the averages mixed into w since its snapshot (GossipLedger)
            version, sigma = self.book.gradient()
            self.sigma_rows.append(
                dict(
                    learner=self.learner, owner=self.learner, version=version, staleness=sigma,
                    time=self.now(),
                )
            )  # fmt: skip
            self.apply(self.w, g, self.clock.own)
            partner = self.book.stepped()
            if partner is not None:  # a sender: exchange with the schedule's neighbour
                self.begin(partner)
        return waited

    def wait_exchange(self) -> float:
        if self.role != SENDER:
            return 0.0
        return self.engine.wait(
            lambda: self.pending is None, f"the answer of learner {self.partner_name()}"
        )

    def partner_name(self) -> str:
        return str(self.ring.members[self.pending[0]]) if self.pending is not None else "none"

    def close(self) -> None:
        """Stop the communication thread (the end of the run drives progress itself)."""
        self.engine.close()
        if self.engine.error is not None:
            raise RuntimeError("the gossip communication thread failed") from self.engine.error

    def finish(self) -> None:
        """Goodbyes (``pserver.protocols.ring``, Termination): a sender's last exchange, then one
        BYE to each neighbour; a receiver answers until every neighbour has said goodbye."""
        self.engine.threaded = False  # the thread is stopped: waits drive progress
        self.finished = False
        while not self.finished:  # again in the new ring after a loss (module docstring)
            if self.broken:
                self.repair()
            if self.role == SENDER:
                self.wait_exchange()
                with self.lock:
                    try:
                        for j in self.ring.neighbours(self.me) if not self.broken else ():
                            self.hdr_out[:2] = (GossipKind.BYE, self.clock.own)
                            self.hdr_out[2:] = self.clock.steps
                            # a copy per neighbour: Isend must not see the buffer change
                            self.byes.append(
                                self.comm.Isend(self.hdr_out.copy(), j, GossipTag.CTRL)
                            )
                    except MPI.Exception as e:
                        self.fail(e)
                self.engine.wait(
                    lambda: self.broken or self.tested(self.byes),
                    "goodbyes to the neighbours to be delivered",
                )
            else:
                self.engine.wait(
                    lambda: self.broken or (self.goodbyes.done and self.serving is None),
                    lambda: f"goodbyes of neighbours {self.goodbye_names()}",
                )
            self.finished = not self.broken

    def goodbye_names(self) -> list[int]:
        return sorted(self.ring.members[p] for p in self.goodbyes.expected) if self.goodbyes else []

    def tested(self, reqs: list[MPI.Request]) -> bool:
        """Whether ``reqs`` completed; a failure breaks the ring (then True: nothing to wait)."""
        try:
            self.look()
            return self.broken or MPI.Request.Testall(reqs)
        except MPI.Exception as e:
            self.fail(e)
            return True

    def check(self) -> bool:
        """Whether the ring is broken (looking at the failed processes first): for the waits
        of the epoch averages, where no traffic of the ring goes."""
        with self.lock:
            try:
                self.look()
            except MPI.Exception as e:
                self.fail(e)
            return self.broken

    # -- a lost learner (module docstring) -----------------------------------------------------

    def look(self) -> None:
        """Break if MPI knows of a failed learner (every ``LOOK_PERIOD`` s; under ULFM only)."""
        now = time.monotonic()
        if self.broken or now < self.next_look or self.waiter.peers.departures is None:
            return
        self.next_look = now + LOOK_PERIOD
        group = self.comm.Get_failed()
        try:
            failed = group.Get_size()
        finally:
            group.Free()
        if failed:
            self.fail(None)

    def fail(self, error: BaseException | None) -> None:
        """A learner died (``error``: the MPI error that said so; None: the failed list did):
        note it, revoke what the learners share and abandon what is in flight. An error that
        is not a survivable failure is raised again."""
        peers = self.waiter.peers
        d = peers.departures
        if d is None or (error is not None and not is_failure(error)):
            if error is None:
                raise GossipError("a learner failed and the run cannot go on without it")
            raise error
        with self.lock:
            new, fatal = d.absorb()
            if fatal:
                peers.fatal = fatal
                raise peers.lost("the ring's exchanges", error)
            for r in new:
                self.waiter.log.warning(
                    "lost %s: its process failed (%s); the ring goes on without it",
                    peers.name(r), error if error is not None else "MPI's failed list",
                )  # fmt: skip
            if self.broken:
                return
            self.broken = True
            with contextlib.suppress(MPI.Exception):  # another survivor may have revoked it
                self.comm.Revoke()
            for revoke in self.on_break:
                revoke()
            # abandoned: a sender had not averaged (it does once the answer is in), a receiver
            # being sent a model had not either; one answering keeps its average
            self.pending, self.serving, self.byes = None, None, []
            self.lock.notify_all()

    def repair(self) -> None:
        """Shrink the learners' communicator to the survivors and go on in their ring
        (module docstring); collective over the survivors, at a step boundary."""
        with self.lock:  # the communication thread waits: it has nothing to do meanwhile
            while self.broken:
                old = self.comm
                new = old.Shrink()  # blocking: Ishrink fails after a death (Open MPI 5.0.11)
                kept = MPI.Group.Translate_ranks(
                    new.Get_group(), list(range(new.Get_size())), old.Get_group()
                )
                ring = self.ring
                for pos in range(old.Get_size()):
                    if pos not in kept:
                        ring = ring.lose(self.ring.members[pos])
                if ring.members[new.Get_rank()] != self.learner:
                    raise GossipError(
                        f"learner {self.learner}: the shrunk communicator puts it at "
                        f"position {new.Get_rank()}, the survivors' ring at "
                        f"{ring.position(self.learner)}"
                    )  # fmt: skip
                self.comm, self.ring, self.me = new, ring, new.Get_rank()
                self.role = ring.role(self.me)
                self.book.regroup(ring, self.me)
                self.world_rank = self.world_ranks()
                self.goodbyes = Goodbyes(ring, self.me) if self.role == RECEIVER else None
                self.broken = False
                self.waiter.log.warning(
                    "learner %d: the ring goes on with λ = %d learners %s, this one a %s",
                    self.learner, ring.size, list(ring.members), self.role,
                )  # fmt: skip
                try:
                    for repaired in self.on_repair:
                        repaired(new)
                except MPI.Exception as e:  # another loss while repairing: again
                    self.fail(e)

    def begin(self, partner: int) -> None:
        """:meth:`start`, a failure breaking the ring (under the lock)."""
        try:
            self.start(partner)
        except MPI.Exception as e:
            self.fail(e)

    # -- progress (under the lock) -------------------------------------------------------------

    def progress(self) -> bool:
        """Test what is in flight once; True when something completed."""
        if not getattr(self.activated, "done", False):
            self.activate()
            self.activated.done = True
        if self.broken:
            return False  # until the main thread repairs (module docstring)
        try:
            self.look()
            if self.broken:
                return True
            return self.sender_progress() if self.role == SENDER else self.receiver_progress()
        except MPI.Exception as e:
            self.fail(e)
            return True

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
                learner=self.learner,
                step=step,
                partner=self.ring.members[partner],
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
