"""Parameter-server shard: owns some blocks, aggregates gradients by the protocol, answers pulls.

The loop receives headers in arrival order on the control communicator and dispatches them
through a handler table. Arithmetic on parameters lives in the updater; synchronization
decisions live in the protocol object; this file only moves messages between them.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver.comm.inbox import Inbox
from pserver.comm.payload import Payloads
from pserver.comm.waiting import Waiter
from pserver.config import inject_plan
from pserver.context import Context
from pserver.epochs import EpochCounter
from pserver.optim import make_updater
from pserver.protocols import UpdateDecision, make_protocol
from pserver.protocols.pull import pull_answer
from pserver.shard_block import ShardBlock
from pserver.topology import Block
from pserver.versions import VersionPool
from pserver.wire import (
    Header,
    Reply,
    Tag,
    WireError,
    header_buffer,
    push_iteration,
    reply_aux,
    reply_tag,
)

# model snapshots a block may queue while one is on its way to statistics: as many as fit in
# SNAPSHOT_QUEUE_BYTES of host copies per shard, between 1 and SNAPSHOT_QUEUE_MAX
SNAPSHOT_QUEUE_MAX = 8
SNAPSHOT_QUEUE_BYTES = 64 << 20


def snapshot_queue(shard_bytes: int) -> int:
    """Queued snapshots per block for a shard of ``shard_bytes``: 8 for small models, one for a
    model whose shard exceeds 64 MiB (a tiny model's epochs end faster than a loaded
    statistics server tests them; a large one's take long enough for one to be plenty)."""
    return max(1, min(SNAPSHOT_QUEUE_MAX, SNAPSHOT_QUEUE_BYTES // max(shard_bytes, 1)))


@dataclass
class BlockState:
    """One block's arithmetic (``pserver.shard_block``), its in-flight sends and held pulls.

    Pulls are served from versions (``pserver.versions``): ``bufs`` are the buffers weight
    sends read (versions of ``w``, or with host staging its staged copies), ``pool`` says which
    one is current and which are pinned by a send still in flight, so an update never waits
    for a receiver.
    """

    block: Block
    arith: ShardBlock
    snapshot: Any  # copy sent to the statistics server for testing
    pool: VersionPool = field(default_factory=lambda: VersionPool(2))
    bufs: list[Any] = field(default_factory=list)  # what sends read, indexed as in ``pool``
    readers: dict[int, int] = field(default_factory=dict)  # learner -> ticket of its version
    staged_ts: int = -1  # timestamp of the staged (or device-synchronized) current version
    copy_cost: float = 0.0  # seconds the last copy-on-write of the block took
    waiting_pulls: list[Header] = field(default_factory=list)
    starved: list[Header] = field(default_factory=list)  # pulls held until a version is free
    inflight: list[tuple[MPI.Request, int]] = field(default_factory=list)  # (send, pool ticket)
    snapshot_reqs: list[MPI.Request] = field(default_factory=list)  # header and payload
    snapshot_hdr: Any = None  # the header those sends read
    queued: list[tuple[int, int, Any]] = field(default_factory=list)  # (epoch, ts, host copy)
    spare: list[Any] = field(default_factory=list)  # host buffers for queued snapshots
    final_epoch: int = 0  # the final snapshot, deferred to ``finish`` behind the others
    skipped_snapshots: int = 0


class ServerShard:
    def __init__(self, ctx: Context, weights: Any) -> None:
        """``weights`` is the whole initial flat vector; this shard keeps a copy of its slices."""
        self.ctx, self.cfg, self.xp = ctx, ctx.cfg, ctx.xp
        self.ch = ctx.channels
        self.shard = ctx.layout.index(ctx.rank)
        self.waiter: Waiter = ctx.waiter()
        self.records = ctx.records()
        self.live = set(ctx.layout.children(None))  # learners, or the top aggregators
        self.out = header_buffer()
        self.shm = ctx.shm if ctx.shm is not None and ctx.rank in ctx.shm.local else None
        self.ack = np.empty(0, dtype=np.int8)  # shared-window copies are acknowledged empty
        self.zero_copy = self.shm is not None and self.shm.zero_copy(ctx.rank)
        # learners whose payloads go through our window (the others use messages)
        self.window_peers = frozenset(self.shm.local[ctx.rank] if self.shm is not None else ())
        mine = ctx.blocks_of(self.shard)
        self.payloads = Payloads(ctx.backend, mine, weights.dtype, self.cfg.comm.staging)
        # with host staging MPI reads staged copies, which are versioned; else w itself is
        self.staged = self.payloads.staged and self.shm is None
        self.blocks = {b.index: self.make_state(b, weights) for b in mine}
        self.handlers = {Tag.PUSH: self.on_push, Tag.PULL: self.on_pull, Tag.BYE: self.on_bye}
        self.first_block = min(self.blocks)
        self.snapshot_depth = snapshot_queue(sum(st.snapshot.nbytes for st in self.blocks.values()))
        self.dropped_after_stop = 0
        self.bytes_in = self.bytes_out = 0
        self.plan = inject_plan(self.cfg)
        self.pulls = dict.fromkeys(self.live, 0)  # pull requests per peer (delay draws)
        self.delayed: list[tuple[float, int, Header]] = []  # heap of replies held back
        self.sequence = itertools.count()

    def make_state(self, b: Block, weights: Any) -> BlockState:
        xp, dtype = self.xp, weights.dtype
        w = xp.array(weights[b.start : b.stop], dtype=dtype)
        if self.shm is not None:  # the weights live in the node's window, where learners read
            w = self.shm.weights(self.ctx.rank, b)
            w[...] = weights[b.start : b.stop]
        arith = ShardBlock(
            w,
            make_protocol(self.cfg, len(self.ctx.layout.learners)),
            make_updater(self.cfg.optim, b.size, xp, dtype),
            self.cfg.optim,
            EpochCounter.from_config(self.cfg, self.ctx.train_size),
            xp,
        )
        return BlockState(
            block=b,
            arith=arith,
            pool=VersionPool(self.version_limit()),
            bufs=[] if self.staged else [w],
            snapshot=np.empty(b.size, dtype=dtype),  # on the host: stats stay off the GPU
        )

    def version_limit(self) -> int:
        """Buffers per block (``comm.versions``; 0: one per reader plus the current one, so a
        pull is never held for lack of a version). The shared window holds its versions."""
        if self.shm is not None:
            return self.shm.versions[self.ctx.rank]
        return self.cfg.comm.versions or 1 + len(self.live)

    def run(self) -> None:
        self.ctx.log.info(
            "serving blocks %s (%s)",
            sorted(self.blocks),
            next(iter(self.blocks.values())).arith.protocol.describe(),
        )
        inbox = Inbox(self.ch.ctrl, self.waiter, self.ctx.peers)
        what = lambda: f"a push or pull from learners {sorted(self.live)}"  # noqa: E731
        while self.live:
            header = inbox.next(
                what, also=self.released, due=self.next_due(), clock=self.ctx.now
            )
            if header is not None:
                handler = self.handlers.get(header.kind)
                if handler is None:
                    raise WireError(f"server got unexpected {header} from rank {header.sender}")
                started = time.perf_counter()
                handler(header)
                self.slow_down(time.perf_counter() - started)
            self.on_time()
            self.answer_starved()
            self.records.maybe_send()
        inbox.close()
        self.finish()

    def next_due(self) -> float | None:
        """The earliest protocol timeout (PSP's τ1) or injected delayed reply."""
        dues = [d for st in self.blocks.values() if (d := st.arith.protocol.deadline()) is not None]
        if self.delayed:
            dues.append(self.delayed[0][0])
        return min(dues, default=None)

    def on_time(self) -> None:
        now = self.ctx.now()
        for st in self.blocks.values():
            if st.arith.protocol.deadline() is not None and st.arith.ready(now):
                self.update(st)
        while self.delayed and self.delayed[0][0] <= now:
            self.answer(heapq.heappop(self.delayed)[2])

    def slow_down(self, elapsed: float) -> None:
        """Injected straggler shard: stretch the handling time by ``inject.server_factor``."""
        factor = self.plan.server_slowdown(self.shard)
        if factor > 1.0:
            time.sleep((factor - 1.0) * elapsed)

    # -- pushes ------------------------------------------------------------------------------

    def on_push(self, h: Header) -> None:
        st = self.blocks[h.block]
        recv = st.arith.inbox()
        if self.shared(h):  # the learner computed it in its slot of our window
            g = self.shm.slot(self.ctx.rank, h.sender, st.block)
            self.shm.sync()
            if h.sender in st.readers:  # done computing: it reads no version until answered
                st.pool.release(st.readers.pop(h.sender))
        else:
            g = recv
            req = self.ch.bulk.Irecv(self.payloads.incoming(h.block, g), h.sender, h.block)
            what = lambda: f"gradient payload of block {h.block} from rank {h.sender}"  # noqa: E731
            self.waiter.wait(req, what)
            self.payloads.arrived(h.block, g)
        self.bytes_in += g.nbytes
        try:
            self.take_gradient(st, h, g)
        finally:
            st.arith.keep()  # the learner may reuse its slot once we answer its pull

    def shared(self, h: Header) -> bool:
        """Whether this push left its gradient in our shared window (a learner of our node)."""
        return h.aux <= 0 and h.sender in self.window_peers  # a learner's push, not a sum

    def take_gradient(self, st: BlockState, h: Header, g: Any) -> None:
        """The protocol's decision on the gradient(s) of one push, now in ``g``."""
        entries = self.contributions(h)
        now = self.ctx.now()
        ts = st.arith.ts
        taken = st.arith.accept(entries, g, now)
        if taken.after_stop:
            self.dropped_after_stop += len(entries)
            return
        for (learner, sent_ts, _), d in zip(entries, taken.decisions, strict=True):
            update = ts + 1 if taken.accepted else -1
            self.record_gradient(st, learner, sent_ts, d.staleness, update)
        if st.arith.ready(now):
            self.update(st)
        elif not taken.accepted and st.arith.epochs.counts_drops:
            self.after_update(st)  # a dropped gradient still consumed a minibatch of the epoch

    def contributions(self, h: Header) -> list[tuple[int, int, int | None]]:
        """(learner, timestamp, iteration tag) of each gradient in a push: one, or an
        aggregator's n (whose pairs carry no iteration: the tree runs the block rule)."""
        if h.aux <= 0:
            return [(self.ctx.layout.index(h.sender), h.timestamp, push_iteration(h.aux))]
        pairs = np.empty(2 * h.aux, dtype=np.int64)
        self.ch.ctrl.Recv(pairs, h.sender, Tag.CLOCK)
        return [(int(pairs[2 * i]), int(pairs[2 * i + 1]), None) for i in range(h.aux)]

    def update(self, st: BlockState) -> None:
        decision = st.arith.commit()
        into = None if self.staged else self.new_version(st)  # sends read w: copy-on-write
        applied = st.arith.apply(decision, into)
        self.record_update(st, applied.decision, applied.lr)
        self.after_update(st)

    def new_version(self, st: BlockState) -> Any:
        """A buffer no send or learner reads, holding the current weights, for the update to
        write (``w`` itself when nothing reads it).

        In place when every send of the current version has completed; else the weights are
        copied to a free version (allocated up to ``comm.versions``), which the pool's rule
        (``VersionPool.may_pin``) keeps whenever the current one is read. Sends to responsive
        receivers are given at most as long as that copy takes (the last one's duration) to
        complete first: driving them is work the shard does anyway, the copy is not. A stopped
        receiver thus delays an update by at most one copy's time, and only the first update
        after it stopped (later ones find its version no longer current).
        """
        self.give_sends(st, st.copy_cost or st.arith.w.nbytes / 2e9)
        write = st.pool.write()
        while len(st.bufs) < st.pool.allocated:
            st.bufs.append(self.version_buffer(st, len(st.bufs)))
        if write.copy_from is not None:
            started = time.perf_counter()
            self.xp.copyto(st.bufs[write.target], st.bufs[write.copy_from])
            st.copy_cost = time.perf_counter() - started
        return st.bufs[write.target]

    def give_sends(self, st: BlockState, seconds: float) -> None:
        """Let the sends reading the current version complete, for at most ``seconds``; not
        when a learner computes on it (shm zero-copy: that takes a whole minibatch)."""
        self.collect(st)
        current = st.pool.current
        if st.pool.readers(current) == 0 or any(
            st.pool.pins.get(t) == current for t in st.readers.values()
        ):
            return
        deadline = time.perf_counter() + seconds

        def done() -> bool:
            self.collect(st)
            return st.pool.readers(current) == 0 or time.perf_counter() >= deadline

        self.waiter.until(done, lambda: f"weight sends of block {st.block.index} (bounded)")

    def version_buffer(self, st: BlockState, version: int) -> Any:
        """A new buffer for version ``version`` of the block (in the window with shm)."""
        if self.shm is not None:
            return self.shm.weights(self.ctx.rank, st.block, version)
        return self.xp.empty_like(st.arith.w)

    def collect(self, st: BlockState) -> bool:
        """Release the versions read by sends that have completed; True if any did."""
        done = [(r, t) for r, t in st.inflight if r.Test()]
        for item in done:
            st.inflight.remove(item)
            st.pool.release(item[1])
        return bool(done)

    def released(self) -> bool:
        """Whether a pull held for lack of a version may go now (polled while idle)."""
        for st in self.blocks.values():
            if st.starved:
                self.collect(st)
                if st.pool.may_pin():
                    return True
        return False

    def answer_starved(self) -> None:
        for st in self.blocks.values():
            if st.starved and st.pool.may_pin():
                starved, st.starved = st.starved, []
                for h in starved:
                    self.answer(h)

    def can_pin(self, st: BlockState) -> bool:
        return st.pool.may_pin() or (self.collect(st) and st.pool.may_pin())

    def after_update(self, st: BlockState) -> None:
        """Tests at epoch ends (``pserver.epochs``), then the held pulls."""
        for epoch in st.arith.epoch_ends().tested:
            self.send_snapshot(st, epoch)
        if st.queued:
            self.advance_snapshots(st)
        self.answer_waiting(st)

    def answer_waiting(self, st: BlockState) -> None:
        waiting, st.waiting_pulls = st.waiting_pulls, []
        for h in waiting:
            self.answer(h)

    # -- pulls -------------------------------------------------------------------------------

    def on_pull(self, h: Header) -> None:
        learner = self.ctx.layout.index(h.sender)
        request = self.pulls[h.sender]
        self.pulls[h.sender] += 1
        delay = self.plan.pull_delay_for(self.shard, learner, request)
        if delay > 0.0:  # a rare, large delay of this reply only (PSP-SGD §4.2)
            due = self.ctx.now() + delay
            heapq.heappush(self.delayed, (due, next(self.sequence), h))
            self.records.add(
                "delays", shard=self.shard, learner=learner, block=h.block, request=request,
                time=self.ctx.now(), delay=delay,
            )
            return
        self.answer(h)

    def answer(self, h: Header) -> None:
        """Rudra's timestamp inquiry: weights go out only when newer than the learner's copy.

        A pull is held while the block is older than the learner asks for (hardsync and PSP:
        the next update) or while the protocol holds the learner back (SSP's bound). A pull that
        would read the current version is also held, alone, while serving it would leave no
        free version for the next update (``VersionPool.may_pin``); a release lets it go.
        """
        st = self.blocks[h.block]
        reads = self.zero_copy and h.sender in self.window_peers  # computes on the version
        a = st.arith
        ready = lambda: a.protocol.pull_ready(self.ctx.layout.index(h.sender))  # noqa: E731
        answer = pull_answer(
            stopped=a.done, ts=a.ts, holds=h.timestamp, accepts=h.aux, ready=ready, reads=reads
        )
        if answer is None:
            st.waiting_pulls.append(h)
        elif answer is not Reply.WEIGHTS:
            self.reply(h.sender, st, answer)
        else:
            if self.staged and st.staged_ts != a.ts:
                self.stage(st)  # once per update, however many learners pull it
            if not self.can_pin(st):
                st.starved.append(h)
            elif reads:  # not written until its next push
                if h.sender in st.readers:  # cannot happen (a push comes between): no leak
                    st.pool.release(st.readers.pop(h.sender))
                st.readers[h.sender] = st.pool.pin()
                current = a.ts == h.timestamp
                if not current:
                    self.shm.sync()  # our update is visible before the reply that announces it
                    self.bytes_out += a.w.nbytes
                kind = Reply.CURRENT if current else Reply.WEIGHTS
                self.reply(h.sender, st, kind, st.pool.current)
            else:
                self.send_weights(h.sender, st)

    def send_weights(self, dest: int, st: BlockState) -> None:
        """Reply with the current version; the send (or the window copy's acknowledgement)
        pins that version until it completes."""
        b = st.block.index
        if dest in self.window_peers:  # the learner copies the version out, then acknowledges
            self.shm.sync()
            self.reply(dest, st, Reply.WEIGHTS, st.pool.current)
            req = self.ch.ack.Irecv(self.ack, dest, b)
        else:
            self.reply(dest, st, Reply.WEIGHTS)
            if not self.staged and st.staged_ts != st.arith.ts:  # MPI must not read a busy device
                self.ctx.backend.synchronize()
                st.staged_ts = st.arith.ts
            req = self.ch.bulk.Isend(st.bufs[st.pool.current], dest, b)
        st.inflight.append((req, st.pool.pin()))
        self.bytes_out += st.arith.w.nbytes

    def stage(self, st: BlockState) -> None:
        """Copy ``w`` to a staged host version no send reads (never waits, see new_version)."""
        self.collect(st)
        write = st.pool.write(copy=False)
        buf = self.payloads.outgoing_version(st.block.index, write.target, st.arith.serve())
        if write.target == len(st.bufs):
            st.bufs.append(buf)
        st.staged_ts = st.arith.ts

    def reply(self, dest: int, st: BlockState, kind: Reply, version: int = 0) -> None:
        aux = reply_aux(kind, version)
        Header(Tag.REPLY, st.block.index, st.arith.ts, self.ctx.rank, aux).pack(self.out[0])
        self.ch.down.Send(self.out[0], dest, reply_tag(st.block.index))

    def on_bye(self, h: Header) -> None:
        self.live.discard(h.sender)
        for st in self.blocks.values():
            st.arith.protocol.retire(self.ctx.layout.index(h.sender))
            self.answer_waiting(st)

    # -- statistics --------------------------------------------------------------------------

    def record_gradient(
        self, st: BlockState, learner: int, ts: int, sigma: int, update: int
    ) -> None:
        if st.block.index != self.first_block:
            return  # every block of a shard sees the same pushes in the same order
        self.records.add(
            "gradients",
            shard=self.shard,
            learner=learner,
            timestamp=ts,
            staleness=sigma,
            update=update,
            time=self.ctx.now(),
        )

    def record_update(self, st: BlockState, d: UpdateDecision, lr: float) -> None:
        if st.block.index != self.first_block:
            return  # blocks of a shard update together; one row per shard keeps the dump lean
        self.records.add(
            "updates",
            shard=self.shard,
            timestamp=d.new_timestamp,
            time=self.ctx.now(),
            n_gradients=len(d.vector_clock),
            mean_staleness=d.mean_staleness,
            lr=lr,
        )
        self.records.add_clock(d.vector_clock)

    def send_snapshot(self, st: BlockState, epoch: int) -> None:
        """Copy the block for the test at an epoch end; the sends overlap later updates.

        Never waits for the statistics server: while the previous snapshot of the block is
        still on its way, this one waits in a queue of ``snapshot_queue()`` host copies; with
        the queue full, this epoch's snapshot is skipped (counted here, and the statistics
        server records the untested epoch). The final snapshot is never skipped: ``finish``
        sends it after the others, as the block no longer changes once training is over.
        Host memory: at most 64 MiB of queued copies per shard (or one copy of a larger
        shard), plus the snapshot in flight.
        """
        self.records.send()  # the progress line at this epoch then shows current staleness
        self.advance_snapshots(st)
        if not st.snapshot_reqs:
            self.ctx.backend.copy_to_host(st.arith.w, st.snapshot)
            self.post_snapshot(st, epoch, st.arith.ts, st.snapshot)
        elif epoch >= self.cfg.run.epochs:
            st.final_epoch = epoch
        elif len(st.queued) < self.snapshot_depth:
            buf = st.spare.pop() if st.spare else np.empty_like(st.snapshot)
            self.ctx.backend.copy_to_host(st.arith.w, buf)
            st.queued.append((epoch, st.arith.ts, buf))
        else:
            st.skipped_snapshots += 1

    def advance_snapshots(self, st: BlockState) -> None:
        """Post the next queued snapshot once the one in flight has arrived (never waits)."""
        if st.snapshot_reqs and MPI.Request.Testall(st.snapshot_reqs):
            st.snapshot_reqs = []
        if st.queued and not st.snapshot_reqs:
            st.spare.append(st.snapshot)
            epoch, ts, buf = st.queued.pop(0)
            self.post_snapshot(st, epoch, ts, buf)

    def post_snapshot(self, st: BlockState, epoch: int, ts: int, buf: Any) -> None:
        if st.snapshot_hdr is None:
            st.snapshot_hdr = header_buffer()[0]
        Header(Tag.MODEL, st.block.index, ts, self.ctx.rank, epoch).pack(st.snapshot_hdr)
        stats = self.ctx.layout.stats
        # synchronous: "in flight" means not yet matched, so the queue bounds what MPI holds
        # for the statistics server too (see pserver.comm.records on MPICH's eager cells)
        st.snapshot, st.snapshot_reqs = buf, [
            self.ch.stats.Issend(st.snapshot_hdr, stats, Tag.MODEL),
            self.ch.stats.Issend(buf, stats, Tag.MODEL),
        ]

    def drain_snapshots(self, st: BlockState) -> None:
        """End of the run: every queued snapshot, then the final one (waiting is fine now)."""
        what = "the statistics server to take a model snapshot"
        while st.queued:
            self.waiter.waitall(st.snapshot_reqs, what)
            self.advance_snapshots(st)
        if st.final_epoch:
            self.waiter.waitall(st.snapshot_reqs, what)
            self.ctx.backend.copy_to_host(st.arith.w, st.snapshot)
            self.post_snapshot(st, st.final_epoch, st.arith.ts, st.snapshot)
        self.waitall(st.snapshot_reqs, what)

    def waitall(self, reqs: list[MPI.Request], what: str) -> None:
        self.waiter.waitall(reqs, what)
        reqs.clear()

    def finish(self) -> None:
        pools = [st.pool for st in self.blocks.values()]
        self.ctx.log.info(
            "pulls served from at most %d version(s) of a block (bound %d); %d of %d writes "
            "copied a version still being sent",
            max(p.high_water for p in pools), pools[0].limit,
            sum(p.copies for p in pools), sum(p.writes for p in pools),
        )  # fmt: skip
        for st in self.blocks.values():
            self.waitall([r for r, _ in st.inflight], "weight sends to drain")
            st.inflight.clear()
            self.drain_snapshots(st)
        self.records.add(
            "servers",
            shard=self.shard,
            updates=max(s.arith.ts for s in self.blocks.values()),
            dropped_after_stop=self.dropped_after_stop,
            wait_time=self.waiter.waited,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            skipped_snapshots=sum(st.skipped_snapshots for st in self.blocks.values()),
            **self.records.usage(),
        )
        for st in self.blocks.values():
            self.records.add(
                "blocks", block=st.block.index, shard=self.shard, timestamp=st.arith.ts,
                applied=st.arith.applied, dropped=st.arith.dropped, size=st.block.size,
            )
        self.records.close(self.waiter)
        hdr = Header(Tag.SERVER_BYE, -1, -1, self.ctx.rank).pack(self.out[0])
        self.records.bye(hdr, Tag.SERVER_BYE, self.waiter)
