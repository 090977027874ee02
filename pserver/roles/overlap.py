"""Rudra-adv* learner: communication overlapped with compute (``comm.mode`` thread | nonblocking).

Weights are pulled into a communication buffer while the learner computes on its compute
buffer; a complete newer model is installed by swapping the two (a pointer swap, never a copy).
Each block's pull is a long poll for weights newer than those the learner holds, so a new model
flows in as soon as the server has one. Gradients go out from two alternating buffers: the push
of one minibatch overlaps the compute of the next, but a push never starts before the previous
one was delivered, so μ stays what the user set (gradients are never summed on the learner).

Under async and n-softsync a learner never waits for a newer model, so on its own it would run
ahead of its gradients without limit: it follows each push with a pull request for weights of
any age, and computes only while at most ``comm.max_inflight`` of its pushes are not yet
acknowledged by an installed answer (:mod:`pserver.inflight`, whose docstring bounds the
staleness this leaves and proves that waiting for the bound cannot deadlock). Hardsync and PSP
wait for the next model before every minibatch, which bounds them already.

``nonblocking``: one thread; the requests progress whenever the learner waits.
``thread``: a communication thread drives the requests (tests with back-off sleeps, so it burns
no core) and wakes the compute thread through a condition variable; progress then continues
during the compute, whose numpy/CuPy kernels release the GIL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from pserver.comm.payload import Payloads
from pserver.comm.waiting import BACKOFF, SPIN_TESTS, tighten_timer_slack
from pserver.context import Context
from pserver.inflight import InflightWindow, inflight_limit
from pserver.protocols.pull import pull_answer
from pserver.roles.learner import Learner
from pserver.topology import Block
from pserver.versions import VersionPool
from pserver.wire import Header, Reply, Tag, WireError, header_buffer, reply_tag


class OverlapLearner(Learner):
    def __init__(self, ctx: Context, weights: Any) -> None:
        super().__init__(ctx, weights)
        self.grads = [self.grad, self.xp.empty_like(self.grad)]
        self.arrived: dict[int, int] = {}  # block -> timestamp now complete in w_comm
        self.current: set[int] = set()  # blocks answered "yours is current" (no payload)
        # async and n-softsync: bound the pushes the model we compute with does not acknowledge
        self.window = (
            None
            if self.waits_for_update
            else InflightWindow(inflight_limit(self.cfg.comm.max_inflight), self.by_index)
        )
        self.pushing: list[MPI.Request] = []
        self.lock = threading.Condition()
        self.threaded = self.cfg.comm.mode == "thread"
        self.closing = threading.Event()
        self.comm_error: BaseException | None = None
        self.thread = threading.Thread(target=self.comm_loop, name="comm", daemon=True)
        # learner broadcast tree: pull from a parent learner, serve our own children
        lay = ctx.layout
        if ctx.rank in lay.bcast_parent:
            self.source = dict.fromkeys(self.source, lay.bcast_parent[ctx.rank])
        self.kids = {r for r, p in lay.bcast_parent.items() if p == ctx.rank}
        self.kids_live = set(self.kids)
        self.kid_hbuf = header_buffer()
        self.kid_waiting: list[Header] = []
        # children are served from versions of the model (pserver.versions): a send pins the
        # one it reads, so installing a new model never waits for a slow or stopped child
        self.serving: list[tuple[MPI.Request, int]] = []  # (weight send to a child, pool ticket)
        self.kid_starved: list[Header] = []  # pulls held until a version is free
        limit = (self.cfg.comm.versions or 1 + len(self.kids)) + 1  # + the one pulled into
        self.kid_pool = VersionPool(limit)
        self.kid_bufs = [self.w, self.w_comm]
        self.kid_incoming = self.kid_pool.reserve()  # w_comm: where the next model arrives
        self.relay = Payloads(ctx.backend, self.blocks, self.w.dtype, self.cfg.comm.staging)
        self.relayed_bytes = 0

    # -- the communication engine (all under self.lock) ----------------------------------------

    def progress(self) -> bool:
        """Test every outstanding request once; True when something completed."""
        changed = False
        for index, req in list(self.asked.items()):
            if req.Test():
                del self.asked[index]
                self.on_overlap_reply(self.by_index[index])
                changed = True
        if self.pushing and MPI.Request.Testall(self.pushing):
            self.pushing = []
            changed = True
        self.collect_kids()
        if self.kid_starved and self.kid_pool.may_pin():  # whoever released the version
            starved, self.kid_starved = self.kid_starved, []
            for h in starved:
                self.serve_kid(h)
        while self.kids_live:
            # a matched probe, not a posted ANY_SOURCE Irecv, which MPICH's UCX netmod loses
            # across hosts (docs/architecture.md, "Wildcard receives"); a header is eager-sized,
            # so once matched its receive completes at once
            msg = self.ch.ctrl.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            if msg is None:
                break
            msg.Recv(self.kid_hbuf)
            self.on_kid(Header.unpack(self.kid_hbuf[0]))
            changed = True
        return changed

    def on_kid(self, h: Header) -> None:
        self.ctx.peers.note(h.sender, h)
        if h.kind is Tag.BYE:
            self.kids_live.discard(h.sender)
        elif h.kind is Tag.PULL:
            self.serve_kid(h)
        else:
            raise WireError(f"learner got unexpected {h} from rank {h.sender}")

    def serve_kid(self, h: Header) -> None:
        """Answer a child learner from the model we compute with (Rudra-adv* broadcast tree)."""
        b = self.by_index[h.block]
        ts = self.have[b.index]
        answer = pull_answer(
            stopped=b.index in self.stopped, ts=ts, holds=h.timestamp, accepts=h.aux
        )
        if answer is None:
            self.kid_waiting.append(h)
        elif answer is not Reply.WEIGHTS:
            self.reply_kid(h.sender, b, ts, answer)
        elif not (self.kid_pool.may_pin() or (self.collect_kids() and self.kid_pool.may_pin())):
            self.kid_starved.append(h)  # only this pull waits for a version to be released
        else:
            self.reply_kid(h.sender, b, ts, Reply.WEIGHTS)
            v = self.kid_pool.current
            buf = self.relay.outgoing_version(b.index, v, self.w[b.start : b.stop])
            self.serving.append((self.ch.bulk.Isend(buf, h.sender, b.index), self.kid_pool.pin()))
            self.relayed_bytes += buf.nbytes

    def collect_kids(self) -> bool:
        """Release the versions read by sends to children that completed; True if any did."""
        done = [(r, t) for r, t in self.serving if r.Test()]
        for item in done:
            self.serving.remove(item)
            self.kid_pool.release(item[1])
        return bool(done)

    def reply_kid(self, dest: int, b: Block, ts: int, kind: Reply) -> None:
        Header(Tag.REPLY, b.index, ts, self.ctx.rank, int(kind)).pack(self.out[0])
        self.ch.down.Send(self.out[0], dest, reply_tag(b.index))

    def answer_kids(self) -> None:
        waiting, self.kid_waiting = self.kid_waiting, []
        for h in waiting:
            self.serve_kid(h)

    def on_overlap_reply(self, b: Block) -> None:
        h = Header.unpack(self.replies[self.blocks.index(b)])
        self.ctx.peers.note(h.sender, h)
        if h.kind is not Tag.REPLY or h.block != b.index:
            raise WireError(f"learner expected a reply for block {b.index}, got {h}")
        if h.aux == Reply.STOP:
            self.stopped.add(b.index)
            if self.window is not None:
                self.window.stop(b.index)
            self.answer_kids()
        elif h.aux == Reply.WEIGHTS:
            req = self.posted.pop(b.index)
            req.Wait()  # the payload follows its header at once: nothing to wait for in practice
            self.payloads.arrived(b.index, self.w_comm[b.start : b.stop])
            self.arrived[b.index] = h.timestamp
            if self.window is not None:
                self.window.answer(b.index)
        elif h.aux == Reply.CURRENT and self.window is not None:  # a request of any age
            self.current.add(b.index)
            self.window.answer(b.index)
        else:  # a long poll asks for newer weights, so CURRENT cannot come back
            raise WireError(f"unexpected reply {h} to a long poll")

    def model_ready(self) -> bool:
        live = [b for b in self.blocks if b.index not in self.stopped]
        answered = self.arrived.keys() | self.current
        return bool(live) and all(b.index in answered for b in live)

    def all_stopped(self) -> bool:
        return len(self.stopped) == len(self.blocks)

    def ask_all(self) -> None:
        for b in self.blocks:
            if b.index not in self.stopped and b.index not in self.asked:
                self.ask(b)

    def oldest(self, b: Block) -> int:
        if self.window is not None:
            return 0  # answered at once: acknowledges our pushes so far (pserver.inflight)
        return self.have[b.index] + 1  # long poll: answered by the next update

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
        if self.kids:
            self.install_version(fresh)
        else:
            self.install(fresh)
        if self.window is None:
            self.ask_all()
        else:
            self.window.install()
            self.ask_uncovered()
        self.answer_kids()

    def install_version(self, fresh: list[Block]) -> None:
        """Install with children reading ``w``: the model that arrived becomes the current
        version and the next one is pulled into a version no send reads (copy-on-write when
        only some blocks arrived), so a child's open send is never waited for."""
        pool, bufs = self.kid_pool, self.kid_bufs
        self.collect_kids()
        if len(fresh) == len(self.blocks) and not self.posted:  # whole model: w_comm becomes w
            pool.publish(self.kid_incoming)
            self.kid_incoming = pool.reserve()  # VersionPool.may_pin leaves one
        else:  # some blocks (others stopped): copy them into a version nobody reads
            write = pool.write()
            self.ensure_versions()
            if write.copy_from is not None:
                self.xp.copyto(bufs[write.target], bufs[write.copy_from])
            self.w = bufs[write.target]
            self.install(fresh)
        self.ensure_versions()
        self.w, self.w_comm = bufs[pool.current], bufs[self.kid_incoming]

    def ensure_versions(self) -> None:
        while len(self.kid_bufs) < self.kid_pool.allocated:
            self.kid_bufs.append(self.xp.empty_like(self.w))

    def start_push(self, grad: Any) -> None:
        for b in self.blocks:
            if b.index in self.stopped:
                continue
            hdr = Header(Tag.PUSH, b.index, self.have[b.index], self.ctx.rank)
            self.ch.ctrl.Send(hdr.pack(self.out[0]), self.owner[b.index], Tag.PUSH)
            buf = self.payloads.outgoing(b.index, grad[b.start : b.stop])
            self.pushing.append(self.ch.bulk.Isend(buf, self.owner[b.index], b.index))
        if self.window is not None:
            self.window.push()
            if not self.asked and not self.arrived and not self.current:
                self.ask_uncovered()  # else asked again once those answers are installed

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, ready: Callable[[], bool], what: str) -> float:
        """Block until ``ready()``; returns the seconds blocked."""
        start = time.perf_counter()
        if self.threaded:
            with self.lock:
                while not ready():
                    if self.comm_error is not None:
                        raise RuntimeError("the communication thread failed") from self.comm_error
                    if not self.lock.wait(timeout=self.cfg.comm.stall_timeout):
                        self.ctx.log.warning(
                            "stalled waiting for %s; last received: %s",
                            what,
                            self.ctx.peers.report(),
                        )
        else:
            self.waiter.until(lambda: (self.progress() and False) or ready(), what)
        return time.perf_counter() - start

    def comm_loop(self) -> None:
        """The communication thread: test the requests, sleep with back-off when idle.

        The back-off is the Waiter's: each sleep is ``BACKOFF`` of the time idle so far, within
        ``comm.poll_min`` … ``comm.poll_max``.
        """
        tighten_timer_slack()
        c = self.cfg.comm
        idle, idle_since = 0, time.monotonic()
        try:
            while not self.closing.is_set():
                with self.lock:
                    changed = self.progress()
                    if changed:
                        self.lock.notify_all()
                if changed:
                    idle, idle_since = 0, time.monotonic()
                    continue
                idle += 1
                if idle > SPIN_TESTS:
                    waited = time.monotonic() - idle_since
                    self.closing.wait(min(max(BACKOFF * waited, c.poll_min), c.poll_max))
        except BaseException as e:  # raised again on the compute thread
            with self.lock:
                self.comm_error = e
                self.lock.notify_all()

    # -- the learner loop ----------------------------------------------------------------------

    def run(self) -> None:
        if self.threaded:
            self.thread.start()
        try:
            if self.window is None:  # async and n-softsync ask after their first push
                with self.lock:
                    self.ask_all()
            while self.overlap_step():
                self.records.maybe_send()
            self.push_time += self.wait(lambda: not self.pushing, "the last push")
            self.wait(lambda: not self.kids_live, f"child learners {sorted(self.kids_live)}")
            self.wait(lambda: not self.serving, "weight sends to child learners")
            self.wait(lambda: not self.kid_starved, "pulls of child learners to be served")
        finally:
            self.closing.set()
            if self.threaded:
                self.thread.join()
            self.prefetch.close()
        self.finish()

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

    def overlap_step(self) -> bool:
        need_new = self.waits_for_update and self.steps > 0  # the first minibatch runs on w0
        pull = 0.0
        while True:  # twice at most when bounded (pserver.inflight: liveness, point 4)
            pull += self.wait(
                lambda n=need_new: self.all_stopped() or self.model_ready() or self.may_go(n),
                self.waiting_for(),
            )
            with self.lock:
                if self.all_stopped():
                    return False
                if self.model_ready():
                    self.install_arrived()
                    need_new = False
                if self.may_go(need_new):
                    break
        self.freeze()  # inject.freeze_*: our long poll is out, its answer will wait for us
        X, y = self.prefetch.get()
        started = time.perf_counter()
        self.grad = self.grads[self.steps % 2]  # free: its push finished before the last began
        self.compute(X, y)
        compute = time.perf_counter() - started
        self.prefetch.release()
        push = self.wait(lambda: not self.pushing, "the previous push to be delivered")
        with self.lock:
            self.start_push(self.grad)
        self.compute_time += compute
        self.pull_time += pull
        self.push_time += push
        self.records.add(
            "train",
            learner=self.index,
            step=self.steps,
            time=self.ctx.now(),
            loss=self.loss,
            error=self.error,
            compute_time=compute,
            wait_time=pull + push,
            pull_time=pull,
            push_time=push,
            stale_fraction=0.0,
            dropped_blocks=0,
        )
        self.steps += 1
        return True
