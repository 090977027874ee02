"""Learner (Rudra §III-B): inquire, pull when newer, compute on a minibatch, push.

Weights arrive in a communication buffer whose receives stay posted between iterations; a pull
that brings every block installs the model by swapping that buffer with the compute buffer
(no copy). The minibatches come from an I/O thread that prefetches from the data server.
"""

from __future__ import annotations

import time
from typing import Any

from mpi4py import MPI

from pserver.context import Context
from pserver.protocols import make_protocol
from pserver.roles.prefetch import Prefetcher
from pserver.wire import Header, Reply, Tag, WireError, header_buffer


class Learner:
    def __init__(self, ctx: Context, weights: Any) -> None:
        self.ctx, self.cfg, self.xp = ctx, ctx.cfg, ctx.xp
        self.ch = ctx.channels
        self.index = ctx.layout.index(ctx.rank)
        self.waiter = ctx.waiter()
        self.records = ctx.records()
        self.model = ctx.model
        self.blocks = ctx.blocks
        self.owner = {b.index: ctx.layout.servers[b.shard] for b in self.blocks}
        self.w = self.xp.asarray(weights)  # compute buffer, replaced on the first pull
        self.w_comm = self.xp.empty_like(self.w)
        self.grad = self.xp.empty_like(self.w)
        self.have = {b.index: -1 for b in self.blocks}  # timestamp of each block we hold
        self.stopped: set[int] = set()
        self.posted: dict[int, MPI.Request] = {}
        self.replies = header_buffer(len(self.blocks))
        self.out = header_buffer()
        self.waits_for_update = make_protocol(self.cfg, len(ctx.layout.learners)).waits_for_update
        self.steps = 0
        self.compute_time = 0.0
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
        if not self.pull():
            return False
        t1 = time.perf_counter()
        X, y = self.prefetch.get()
        t2 = time.perf_counter()
        if self.index == self.cfg.inject.fail_learner and self.steps == self.cfg.inject.fail_step:
            raise RuntimeError(f"failure injected at step {self.steps} (inject.fail_learner)")
        loss, error = self.model.loss_grad(self.w, X, y, self.grad)
        self.ctx.backend.synchronize()
        if self.cfg.inject.compute_time:
            time.sleep(self.cfg.inject.compute_time)  # emulated accelerator work: the CPU idles
        t3 = time.perf_counter()
        self.prefetch.release()
        self.push()
        t4 = time.perf_counter()
        self.compute_time += t3 - t2
        self.records.add(
            "train",
            learner=self.index,
            step=self.steps,
            time=self.ctx.now(),
            loss=loss,
            error=error,
            compute_time=t3 - t2,
            wait_time=(t1 - t0) + (t2 - t1) + (t4 - t3),
        )
        self.steps += 1
        return True

    # -- pull --------------------------------------------------------------------------------

    def pull(self) -> bool:
        """Ask each live block for weights newer than ours; False once every block has stopped."""
        live = [b for b in self.blocks if b.index not in self.stopped]
        for b in live:
            self.post_payload(b)
        reqs = []
        for i, b in enumerate(live):
            oldest = self.have[b.index] + 1 if self.waits_for_update else 0
            hdr = Header(Tag.PULL, b.index, self.have[b.index], self.ctx.rank, oldest)
            self.ch.ctrl.Send(hdr.pack(self.out[0]), self.owner[b.index], Tag.PULL)
            reqs.append(self.ch.ctrl.Irecv(self.replies[i], self.owner[b.index], Tag.REPLY))
        self.waiter.waitall(reqs, lambda: f"weights of blocks {[b.index for b in live]}")
        fresh = []
        for i, b in enumerate(live):
            h = Header.unpack(self.replies[i])
            self.ctx.peers.note(h.sender, h)
            if h.kind is not Tag.REPLY or h.block != b.index:
                raise WireError(f"learner expected a reply for block {b.index}, got {h}")
            if h.aux == Reply.STOP:
                self.stopped.add(b.index)
            elif h.aux == Reply.WEIGHTS:
                req = self.posted.pop(b.index)
                self.waiter.wait(req, f"weights payload of block {b.index}")
                self.have[b.index] = h.timestamp
                fresh.append(b)
        self.install(fresh)
        return len(self.stopped) < len(self.blocks)

    def post_payload(self, b: Any) -> None:
        """Keep one receive posted per block, into the communication buffer."""
        if b.index not in self.posted:
            view = self.w_comm[b.start : b.stop]
            self.posted[b.index] = self.ch.bulk.Irecv(view, self.owner[b.index], b.index)

    def install(self, fresh: list[Any]) -> None:
        if len(fresh) == len(self.blocks):
            self.w, self.w_comm = self.w_comm, self.w  # whole new model: pointer swap
            return
        for b in fresh:  # some blocks only: copy them, the rest of w_comm is not ours to touch
            self.xp.copyto(self.w[b.start : b.stop], self.w_comm[b.start : b.stop])

    # -- push --------------------------------------------------------------------------------

    def push(self) -> None:
        """Send every live block's gradient with the timestamp it was computed from."""
        reqs = []
        for b in self.blocks:
            if b.index in self.stopped:
                continue
            hdr = Header(Tag.PUSH, b.index, self.have[b.index], self.ctx.rank)
            self.ch.ctrl.Send(hdr.pack(self.out[0]), self.owner[b.index], Tag.PUSH)
            reqs.append(
                self.ch.bulk.Isend(self.grad[b.start : b.stop], self.owner[b.index], b.index)
            )
        self.waiter.waitall(reqs, "gradient pushes to be delivered")

    # -- end ---------------------------------------------------------------------------------

    def finish(self) -> None:
        for req in self.posted.values():
            req.Cancel()
        MPI.Request.Waitall(list(self.posted.values()))
        self.posted.clear()
        bye = Header(Tag.BYE, -1, -1, self.ctx.rank).pack(self.out[0])
        for server in self.ctx.layout.servers:
            self.ch.ctrl.Send(bye, server, Tag.BYE)
        self.ch.io.Send(bye, self.ctx.layout.data, Tag.BYE)
        self.records.add(
            "learners",
            learner=self.index,
            minibatches=self.steps,
            compute_time=self.compute_time,
            wait_time=self.waiter.waited + self.prefetch.waited,
            samples=self.steps * self.cfg.data.batch_size,
        )
        self.records.send()
        self.ch.stats.Send(bye, self.ctx.layout.stats, Tag.BYE)
