"""Learner (Rudra §III-B): inquire, pull when newer, compute on a minibatch, push.

Weights arrive in a communication buffer whose receives stay posted between iterations; a pull
that brings every block installs the model by swapping that buffer with the compute buffer
(no copy). The minibatches come from an I/O thread that prefetches from the data server.

Partial pulling (PSP-SGD Algorithm 1, worker lines 7-15): the learner may start computing once
``protocol.pull_fraction`` of the blocks it asked for are in (plus ``protocol.tau2``), keeping
its previous copy of the others. A reply that misses the iteration stays outstanding and is
picked up by a later one; no request is sent twice. The timestamps of pulls and pushes follow
``protocol.pull_timestamp`` (``PullRule``): with partial pulling under hardsync or PSP every push
of an iteration carries the learner's iteration tag (PSP-SGD Algorithm 1, worker line 17), so
that a gradient computed on a kept copy still answers the block's round; the liveness proof is
in ``pserver/protocols/rounds.py``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from mpi4py import MPI

from pserver.comm.payload import Payloads
from pserver.config import inject_plan, pull_timestamp
from pserver.context import Context
from pserver.errors import diverged
from pserver.partial_pull import PartialPull, PullRule
from pserver.roles.prefetch import Prefetcher
from pserver.strategies import lookup
from pserver.topology import Block
from pserver.wire import (
    Header,
    Reply,
    Tag,
    WireError,
    header_buffer,
    push_aux,
    reply_tag,
    split_reply,
)


class Learner:
    def __init__(self, ctx: Context, weights: Any) -> None:
        self.ctx, self.cfg, self.xp = ctx, ctx.cfg, ctx.xp
        self.ch = ctx.channels
        self.index = ctx.layout.index(ctx.rank)
        self.waiter = ctx.waiter()
        self.records = ctx.records()
        self.model = ctx.model
        self.blocks = ctx.blocks
        self.by_index = {b.index: b for b in self.blocks}
        lay = ctx.layout  # where each block goes: its shard, or our aggregator in a tree
        self.owner = {b.index: lay.upstream(ctx.rank, lay.servers[b.shard]) for b in self.blocks}
        self.source = dict(self.owner)  # where weights come from (a learner, with a bcast tree)
        self.w = self.xp.asarray(weights)  # compute buffer: w0, replaced by the first new model
        self.w_comm = self.xp.empty_like(self.w)
        self.grad = self.xp.empty_like(self.w)
        # comm.transport = "shm": blocks whose shard shares our node go through its window
        self.ack = self.xp.empty(0, dtype=self.xp.int8)
        self.shared = {
            b.index: lay.servers[b.shard]
            for b in self.blocks
            if ctx.shm is not None and ctx.shm.shares(lay.servers[b.shard], ctx.rank)
        }
        # one shard owns the whole model: compute the gradient straight into our slot
        self.grad_in_slot = len(self.shared) == len(self.blocks) and len(lay.servers) == 1
        if self.grad_in_slot:
            self.grad = ctx.shm.slot(lay.servers[0], ctx.rank)
        # one shard, one block: compute on the window version the reply names, without a copy
        self.zero_copy = bool(self.shared) and ctx.shm.zero_copy(lay.servers[0])
        self.window_w: Any = None
        self.payloads = Payloads(ctx.backend, self.blocks, self.w.dtype, self.cfg.comm.staging)
        # timestamp of each block we hold: every rank builds w0 from run.seed (cli.run), so a
        # learner starts on timestamp 0 without pulling it (λ copies of the model at startup)
        self.have = {b.index: 0 for b in self.blocks}
        self.stopped: set[int] = set()
        self.posted: dict[int, MPI.Request] = {}  # weight payload receives, into w_comm
        self.asked: dict[int, MPI.Request] = {}  # reply headers still outstanding
        self.pushing: list[MPI.Request] = []  # gradient sends reading ``grad``
        self.replies = header_buffer(len(self.blocks))
        self.out = header_buffer()
        self.waits_for_update = lookup(self.cfg.protocol.name).waits_for_update
        p = self.cfg.protocol
        self.partial = PartialPull(len(self.blocks), p.pull_fraction, p.tau2)
        self.rule = PullRule(pull_timestamp(self.cfg), self.waits_for_update)
        self.inject = inject_plan(self.cfg)
        self.extra_compute = self.inject.compute_time_for(self.index)
        self.slow = self.index == self.cfg.inject.slow_learner
        self.steps = 0
        self.compute_time = self.pull_time = self.push_time = 0.0
        self.prefetch = Prefetcher(ctx)

    def run(self) -> None:
        try:
            while self.step():
                self.records.maybe_send()
        finally:
            self.prefetch.close()
        self.finish()

    def step(self) -> bool:
        t0 = time.perf_counter()
        if self.steps > 0 and not self.pull():  # the first minibatch runs on w0
            return False
        t1 = time.perf_counter()
        X, y = self.prefetch.get()
        t2 = time.perf_counter()
        self.compute(X, y)
        t3 = time.perf_counter()
        self.prefetch.release()
        self.push()
        t4 = time.perf_counter()
        self.freeze()
        self.compute_time += t3 - t2
        self.pull_time += t1 - t0
        self.push_time += t4 - t3
        self.records.add(
            "train",
            learner=self.index,
            step=self.steps,
            time=self.ctx.now(),
            loss=self.loss,
            error=self.error,
            compute_time=t3 - t2,
            wait_time=(t1 - t0) + (t2 - t1) + (t4 - t3),
            pull_time=t1 - t0,
            push_time=t4 - t3,
            stale_fraction=self.partial.stale_fraction,
            dropped_blocks=self.partial.dropped,
        )
        self.steps += 1
        return True

    def compute(self, X: Any, y: Any) -> None:
        if self.index == self.cfg.inject.fail_learner and self.steps == self.cfg.inject.fail_step:
            raise RuntimeError(f"failure injected at step {self.steps} (inject.fail_learner)")
        started = time.perf_counter()
        self.loss, self.error = self.model.loss_grad(self.w, X, y, self.grad)
        if not math.isfinite(self.loss):  # NaN or inf weights (or lr too large): stop now
            bad = int((~self.xp.isfinite(self.w)).sum())
            raise diverged(self.loss, self.steps, self.have, bad, self.cfg.optim.lr)
        self.ctx.backend.synchronize()
        extra = self.extra_compute  # emulated accelerator work: the CPU idles
        if self.slow:  # an injected straggler also takes longer for its real compute
            extra += (self.cfg.inject.learner_factor - 1.0) * (time.perf_counter() - started)
        if extra > 0.0:
            time.sleep(extra)

    def freeze(self) -> None:
        """``inject.freeze_*``: stop without calling MPI, weights of our pull on their way."""
        seconds = self.inject.freeze_for(self.index, self.steps)
        if seconds > 0.0:
            time.sleep(seconds)

    # -- pull --------------------------------------------------------------------------------

    def pull(self) -> bool:
        """Ask each live block for weights newer than ours; False once every block has stopped."""
        live = [b for b in self.blocks if b.index not in self.stopped]
        # hardsync and PSP: newer than our copy (block rule) or than our last iteration's tag
        wanted = {b.index: self.oldest(b) for b in live}
        self.partial.start(self.ctx.now(), wanted)
        for b in live:
            if b.index not in self.asked:
                self.ask(b)
        fresh: list[Block] = []

        def done() -> bool:
            for index, req in list(self.asked.items()):
                if req.Test():
                    del self.asked[index]
                    self.on_reply(self.by_index[index], fresh)
            return not self.asked or self.partial.ready(self.ctx.now())

        self.waiter.until(done, lambda: f"weights of blocks {sorted(self.asked)}")
        # the next compute overwrites ``grad``; the server took the pushes before our pulls
        self.waiter.waitall(self.pushing, "gradient pushes to be delivered")
        self.pushing.clear()
        self.install(fresh)
        self.rule.pulled({i: ts for i, ts in self.have.items() if i not in self.stopped})
        return len(self.stopped) < len(self.blocks)

    def oldest(self, b: Block) -> int:
        return self.rule.oldest(self.have[b.index])

    def ask(self, b: Block) -> None:
        """Send a pull request (Rudra's timestamp inquiry) and post receives for the answer."""
        if b.index not in self.posted and b.index not in self.shared:
            buf = self.payloads.incoming(b.index, self.w_comm[b.start : b.stop])
            self.posted[b.index] = self.ch.bulk.Irecv(buf, self.source[b.index], b.index)
        hdr = Header(Tag.PULL, b.index, self.have[b.index], self.ctx.rank, self.oldest(b))
        self.ch.ctrl.Send(hdr.pack(self.out[0]), self.source[b.index], Tag.PULL)
        row = self.replies[self.blocks.index(b)]
        self.asked[b.index] = self.ch.down.Irecv(row, self.source[b.index], reply_tag(b.index))

    def on_reply(self, b: Block, fresh: list[Block]) -> None:
        h = Header.unpack(self.replies[self.blocks.index(b)])
        self.ctx.peers.note(h.sender, h)
        if h.kind is not Tag.REPLY or h.block != b.index:
            raise WireError(f"learner expected a reply for block {b.index}, got {h}")
        now = self.ctx.now()
        kind, version = split_reply(h.aux)
        if kind == Reply.STOP:
            self.stopped.add(b.index)
            self.partial.forget(b.index, now)  # done: never wait for it again
        elif kind == Reply.CURRENT:
            # our copy is fresh enough, unless the iteration rule's requirement rose meanwhile
            if not self.partial.on_block(b.index, h.timestamp, now):
                self.ask(b)
        elif kind == Reply.WEIGHTS:
            if self.zero_copy:  # ours to compute on until our next push
                self.ctx.shm.sync()
                self.window_w = self.ctx.shm.weights(self.shared[b.index], b, version)
            elif b.index in self.shared:
                self.copy_shared(b, version)
            else:
                req = self.posted.pop(b.index)
                self.waiter.wait(req, f"weights payload of block {b.index}")
                self.payloads.arrived(b.index, self.w_comm[b.start : b.stop])
            if self.partial.on_block(b.index, h.timestamp, now):
                self.have[b.index] = h.timestamp
                fresh.append(b)
            elif b.index not in self.stopped:  # older than this iteration needs: ask again
                self.ask(b)
        else:
            raise WireError(f"unknown reply {h}")

    def copy_shared(self, b: Block, version: int) -> None:
        """Copy block ``b`` (the version the reply names) out of its shard's window, then
        acknowledge: the shard may reuse that version once every copy of it is acknowledged."""
        shm, server = self.ctx.shm, self.shared[b.index]
        shm.sync()
        self.xp.copyto(self.w_comm[b.start : b.stop], shm.weights(server, b, version))
        self.ch.ack.Send(self.ack, server, b.index)

    def install(self, fresh: list[Block]) -> None:
        if self.zero_copy:
            if fresh:
                self.w = self.window_w
            return
        if len(fresh) == len(self.blocks) and not self.posted:
            self.w, self.w_comm = self.w_comm, self.w  # whole new model: pointer swap
            return
        for b in fresh:  # some blocks only: copy them; receives may still target w_comm
            self.xp.copyto(self.w[b.start : b.stop], self.w_comm[b.start : b.stop])

    # -- push --------------------------------------------------------------------------------

    def push(self) -> None:
        """Send every live block's gradient with the timestamp it was computed from.

        Each push is followed at once by the next pull request of that block: the server reads
        its control messages in order, so the pull is answered only after the gradient has been
        taken (Rudra-base semantics unchanged), while block k's weights can travel back as
        block k+1's gradient arrives. The sends are waited for before ``grad`` is reused.
        """
        for b in self.blocks:
            if b.index in self.stopped:
                continue
            aux = push_aux(self.rule.push_iteration())  # the iteration tag, or 0
            hdr = Header(Tag.PUSH, b.index, self.have[b.index], self.ctx.rank, aux)
            shared = b.index in self.shared  # the shard reads the gradient in its window
            if shared:
                if not self.grad_in_slot:  # several shards: the slots are apart
                    slot = self.ctx.shm.slot(self.shared[b.index], self.ctx.rank, b)
                    self.xp.copyto(slot, self.grad[b.start : b.stop])
                self.ctx.shm.sync()  # the gradient is visible before the header announces it
            self.ch.ctrl.Send(hdr.pack(self.out[0]), self.owner[b.index], Tag.PUSH)
            if not shared:
                buf = self.payloads.outgoing(b.index, self.grad[b.start : b.stop])
                self.pushing.append(self.ch.bulk.Isend(buf, self.owner[b.index], b.index))
            if b.index not in self.asked and self.source[b.index] == self.owner[b.index]:
                self.ask(b)

    # -- end ---------------------------------------------------------------------------------

    def finish(self) -> None:
        """Collect late replies, cancel the idle receives, and say goodbye to everyone."""
        late: list[Block] = []
        self.waiter.waitall(self.pushing, "the last gradient pushes to be delivered")
        while self.asked:
            index, req = next(iter(self.asked.items()))
            self.waiter.wait(req, f"the late reply of block {index}")
            del self.asked[index]
            self.on_reply(self.by_index[index], late)
        for req in self.posted.values():
            req.Cancel()
        MPI.Request.Waitall(list(self.posted.values()))
        self.posted.clear()
        bye = Header(Tag.BYE, -1, -1, self.ctx.rank).pack(self.out[0])
        for upstream in sorted(set(self.owner.values()) | set(self.source.values())):
            self.ch.ctrl.Send(bye, upstream, Tag.BYE)
        self.ch.io.Send(bye, self.ctx.layout.data, Tag.BYE)
        self.records.add(
            "learners",
            learner=self.index,
            minibatches=self.steps,
            compute_time=self.compute_time,
            wait_time=self.waiter.waited + self.prefetch.waited,
            samples=self.steps * self.cfg.data.batch_size,
            pull_time=self.pull_time,
            push_time=self.push_time,
            relayed_bytes=getattr(self, "relayed_bytes", 0),
            # Rudra Table I: the share of a learner's time spent computing, not blocked
            overlap=self.compute_time
            / max(self.compute_time + self.pull_time + self.push_time, 1e-12),
            **self.records.usage(),
        )
        self.records.close(self.waiter)
        self.records.bye(bye, Tag.BYE, self.waiter)
