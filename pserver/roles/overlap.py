"""Rudra-adv* exchange: communication overlapped with compute (``comm.mode`` thread | nonblocking).

Weights are pulled into a communication buffer while the learner computes on its compute
buffer; a complete newer model is installed by swapping the two (a pointer swap, never a copy).
Each block's pull is a long poll for weights newer than those the learner holds, so a new model
flows in as soon as the server has one. Gradients go out from two alternating buffers: the push
of one minibatch overlaps the compute of the next, but a push never starts before the previous
one was delivered, so μ stays what the user set (gradients are never summed on the learner).

Under async and n-softsync a learner never waits for a newer model, so on its own it would run
ahead of its gradients without limit: it follows each push with a pull request for weights of
any age, and computes only while at most ``comm.max_inflight`` of its pushes are not yet
acknowledged by an installed answer (:mod:`pserver.protocols.inflight`, whose docstring bounds the
staleness this leaves and proves that waiting for the bound cannot deadlock). Hardsync and PSP
wait for the next model before every minibatch, which bounds them already.

The requests progress in :class:`pserver.comm.engine.CommEngine` (one owner of MPI progress):
``nonblocking``: one thread; the requests progress whenever the learner waits.
``thread``: a communication thread drives the requests (tests with back-off sleeps, so it burns
no core) and wakes the compute thread through a condition variable; progress then continues
during the compute, whose numpy/CuPy kernels release the GIL. A learner's children in a
broadcast tree are served by :class:`pserver.roles.bcast.Children`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from pserver.ckpt.files import State
from pserver.ckpt.records.pipeline import Replay, pipeline_state, restore_pipeline
from pserver.comm.engine import CommEngine
from pserver.comm.wire import Reply, WireError, reply_kind
from pserver.plan.topology import Block
from pserver.protocols.inflight import InflightWindow, inflight_limit
from pserver.roles.bcast import Children
from pserver.roles.exchange import Exchange, LearnerSide
from pserver.roles.learner import waits_for_update
from pserver.roles.pslink import PSLink


class OverlapExchange(Exchange):
    """Overlapped PS client: long polls, two gradient buffers, the in-flight window."""

    freeze_after_weights = True  # inject.freeze_*: our long poll is out, its answer waits for us

    def __init__(self, side: LearnerSide, weights: Any) -> None:
        self.side, self.cfg, self.xp = side, side.cfg, side.xp
        self.link = link = PSLink(side, weights)
        self.blocks, self.by_index = link.blocks, link.by_index
        self.have, self.stopped, self.asked = link.have, link.stopped, link.asked  # shared
        self.waiter = side.waiter()
        self.waits_for_update = waits_for_update(side.cfg)
        self.grads = [self.xp.empty_like(link.w), self.xp.empty_like(link.w)]
        self.arrived: dict[int, int] = {}  # block -> timestamp now complete in w_comm
        self.current: set[int] = set()  # blocks answered "yours is current" (no payload)
        # async and n-softsync: bound the pushes the model we compute with does not acknowledge
        self.window = (
            None
            if self.waits_for_update
            else InflightWindow(inflight_limit(self.cfg.comm.max_inflight), self.by_index)
        )
        if side.rank in side.layout.bcast_parent:  # learner broadcast tree: pull from a parent
            link.source.update(dict.fromkeys(link.source, side.layout.bcast_parent[side.rank]))
        self.kids = Children(side, link)
        self.engine = CommEngine(self.progress, self.waiter, self.cfg.comm.mode == "thread")
        self.lock = self.engine.lock
        self.steps = 0
        self.started = False
        self.must_pull = False  # resumed: the first minibatch waits for the shards' model
        # the last two pushes (number, {block: timestamp}): their gradients are still in
        # ``grads``, a checkpoint saves those the shards dropped at their stop (overlap_ckpt)
        self.recent: deque[tuple[int, dict[int, int]]] = deque(maxlen=2)
        self.replay: Replay | None = None  # resumed with a pipeline: what begin() sends again
        self.left = False  # our broadcast-tree parent stopped at a cut (pserver.roles.bcast)

    @property
    def relayed_bytes(self) -> int:
        return self.kids.relayed_bytes

    # -- progress (CommEngine drives it, under self.lock) --------------------------------------

    def progress(self) -> bool:
        """Test every outstanding request once; True when something completed."""
        changed = False
        for b in self.link.answered():
            self.on_reply(b)
            changed = True
        pushing = self.link.pushing
        if pushing and MPI.Request.Testall(pushing):
            pushing.clear()
            changed = True
        return self.kids.progress() or changed

    def on_reply(self, b: Block) -> None:
        h = self.link.reply(b)
        kind = reply_kind(h.aux)
        if kind == Reply.STOP:
            self.stopped.add(b.index)
            if self.window is not None:
                self.window.stop(b.index)
            self.kids.answer()
        elif kind == Reply.WEIGHTS:
            req = self.link.payload_request(b)
            req.Wait()  # the payload follows its header at once: nothing to wait for in practice
            self.link.arrived(b)
            self.arrived[b.index] = h.timestamp
            if self.window is not None:
                self.window.answer(b.index)
        elif kind == Reply.LEFT:  # our broadcast-tree parent stopped at a cut: so do we
            self.left = True
        elif kind == Reply.CURRENT and self.window is not None:  # a request of any age
            self.current.add(b.index)
            self.window.answer(b.index)
        else:  # a long poll asks for newer weights, so CURRENT cannot come back
            raise WireError(f"unexpected reply {h} to a long poll")

    def model_ready(self) -> bool:
        live = self.link.live()
        answered = self.arrived.keys() | self.current
        return bool(live) and all(b.index in answered for b in live)

    def ask(self, b: Block) -> None:
        # async/softsync: answered at once, acknowledging our pushes so far
        # (pserver.protocols.inflight);
        # hardsync/PSP: a long poll, answered by the next update
        self.link.ask(b, 0 if self.window is not None else self.have[b.index] + 1)

    def ask_all(self) -> None:
        for b in self.link.live():
            # an answer restored from a checkpoint waits to be installed: its block is asked then
            if b.index not in self.asked and b.index not in self.arrived.keys() | self.current:
                self.ask(b)

    def ask_uncovered(self) -> None:
        """Ask again every live block with pushes that no request was sent after."""
        assert self.window is not None
        for index in self.window.uncovered():
            if index not in self.asked:
                self.ask(self.by_index[index])
                self.window.ask(index)

    def install_arrived(self) -> None:
        fresh = [self.by_index[i] for i in self.arrived]
        for b in fresh:
            self.have[b.index] = self.arrived[b.index]
        self.arrived.clear()
        self.current.clear()
        if self.kids.kids:
            self.kids.install(fresh)
        else:
            self.link.install(fresh)
        if self.window is None:
            self.ask_all()
        else:
            self.window.install()
            self.ask_uncovered()
        self.kids.answer()

    def start_push(self, grad: Any) -> None:
        live = self.link.live()
        self.recent.append((self.steps, {b.index: self.have[b.index] for b in live}))
        for b in live:
            self.link.push(b, grad)
        if self.window is not None:
            self.window.push()
            if not self.asked and not self.arrived and not self.current:
                self.ask_uncovered()  # else asked again once those answers are installed

    # -- the exchange --------------------------------------------------------------------------

    def wait(self, ready: Callable[[], bool], what: str) -> float:
        """Block until ``ready()`` while the engine makes progress; the seconds blocked."""
        return self.engine.wait(ready, what)

    def waiting_for(self) -> str:
        """What the wait before a minibatch waits for, for the stall report."""
        what = f"weights of blocks {sorted(self.asked)}"
        w = self.window
        if w is not None and not w.may_compute():
            what += (
                f" ({w.unacknowledged()} of our pushes unacknowledged, "
                f"comm.max_inflight allows {w.limit})"
            )
        return what

    def may_go(self, need_new: bool) -> bool:
        """Whether the next minibatch may be computed on the installed model."""
        return not need_new and (self.window is None or self.window.may_compute())

    def begin(self) -> None:
        """Before the first minibatch: start the engine; async and n-softsync ask only after
        their first push, the others post their long polls now."""
        self.started = True
        self.engine.start()
        if self.replay is not None:  # resumed with a pipeline: what the cut left undone
            self.resend()
        if self.window is None or self.must_pull:
            with self.lock:
                self.ask_all()

    def resend(self) -> None:
        """Before the first minibatch of a resumed run (async, n-softsync): send the requests
        the shards answered STOP at the cut and the pushes they dropped, in their original
        order (the pipeline's record, :mod:`pserver.ckpt.records.pipeline`, saved them).

        A request goes just before the first dropped push it preceded (its ``covered`` count),
        the others after the last; a dropped push goes with the timestamps it was first sent
        with, from the gradient buffer it was computed in. Each push is delivered before the
        next one reuses a buffer (:meth:`gradient` keeps the same rule). Liveness: the only
        wait is for a push's delivery, which its shard receives as any other (it reads every
        header until every learner said goodbye, and this learner has not); the requests sent
        are answered as the uninterrupted run's were (``pserver.protocols.inflight``, point 3).
        """
        assert self.replay is not None
        stopped, drops = self.replay
        self.replay = ([], [])
        w = self.window
        pending = sorted(b for b in stopped if b in self.by_index)
        for p, ts, g in drops:
            with self.lock:
                for b in [b for b in pending if w is None or w.covered[b] <= p]:
                    self.ask(self.by_index[b])
                    pending.remove(b)
                buf = self.grads[p % 2]
                self.side.backend.copy_from_host(g, buf)
                held = dict(self.have)
                for b, t in sorted(ts.items()):
                    self.have[b] = t  # the timestamp it was computed from (staleness, S̄)
                    self.link.push(self.by_index[b], buf)
                self.have.update(held)
                self.recent.append((p, dict(ts)))  # dropped again if the shards are still done
            self.wait(lambda: not self.link.pushing, "the dropped pushes sent again")
        with self.lock:
            for b in pending:
                self.ask(self.by_index[b])

    def weights(self) -> Any | None:
        if not self.started:
            self.begin()
        # the first minibatch runs on w0, unless resumed from a checkpoint
        need_new = (self.waits_for_update and self.steps > 0) or self.must_pull
        while True:  # twice at most when bounded (pserver.protocols.inflight: liveness, point 4)
            self.wait(
                lambda n=need_new: self.ended() or self.model_ready() or self.may_go(n),
                self.waiting_for(),
            )
            with self.lock:
                if self.ended():
                    return None
                if self.model_ready():
                    self.install_arrived()
                    need_new = self.must_pull = False
                if self.may_go(need_new):
                    return self.link.w

    def ended(self) -> bool:
        """Every block stopped, or our broadcast-tree parent left at a cut (pserver.roles.bcast)."""
        return self.link.all_stopped() or self.left

    def gradient_buffer(self) -> Any:
        return self.grads[self.steps % 2]  # free: its push finished before the last began

    def gradient(self, g: Any) -> None:
        self.wait(lambda: not self.link.pushing, "the previous push to be delivered")
        with self.lock:
            self.start_push(g)
        self.steps += 1

    def staleness(self) -> tuple[float, int]:
        return 0.0, 0  # every block of a model is installed together

    def done(self) -> float:
        """Deliver the last push, then serve the children until they said goodbye."""
        blocked = self.wait(lambda: not self.link.pushing, "the last push")
        # stopped by a signal (pserver.runtime.signals) before the shards stopped: our last pull
        # requests are answered once the rounds our pushes complete are applied
        self.wait(lambda: not self.link.asked, "the answers to our last pull requests")
        if not self.link.all_stopped():  # a cut: our children get no newer model from us
            with self.lock:
                self.kids.leave()
        self.wait(self.kids.drained, self.kids.pending())
        return blocked

    def state(self) -> State:
        """The pipeline: compute copy, answers not installed, window, dropped pushes
        (:mod:`pserver.ckpt.records.pipeline`)."""
        return pipeline_state(self)

    def restore(self, state: State) -> None:
        """Resume where the cut left the pipeline (:mod:`pserver.ckpt.records.pipeline`); from a
        checkpoint without it, compute nothing before the shards' model has arrived."""
        self.steps = int(state.attrs.get("steps", 0))
        if "pipeline" in state.attrs:
            restore_pipeline(self, state)
            return
        self.must_pull = True
        for index in self.have:
            self.have[index] = -1  # older than any model: every block answers with weights

    def close(self) -> None:
        self.engine.close()

    def finish(self) -> None:
        """Say goodbye upstream (every block stopped: no reply is outstanding)."""
        self.waiter.waitall(self.link.pushing, "the last gradient pushes to be delivered")
        self.link.goodbye()
