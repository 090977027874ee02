"""Parameter-server shard: owns some blocks, aggregates gradients by the protocol, answers pulls.

The loop receives headers in arrival order on the control communicator and dispatches them
through a handler table. This file keeps requests, pushes and bookkeeping; each block's
arithmetic, protocol round and epoch count live in ``pserver.protocols.shard_block`` (pure), the
answer to
a pull in ``pserver.protocols.pull`` (applied, held pulls and replies in ``shard_pulls``), the
versions pulls read in ``shard_versions`` and the snapshots for the statistics server in
``snapshots``, how blocks are built in ``shard_state``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pserver.ckpt.drivers.shm import host_copy
from pserver.ckpt.files import State
from pserver.ckpt.records.aggregator import departed_learners
from pserver.ckpt.records.shard import block_state, restore_block
from pserver.comm.inbox import Inbox
from pserver.comm.payload import Payloads
from pserver.comm.waiting import Waiter
from pserver.comm.wire import (
    Header,
    Tag,
    WireError,
    header_buffer,
    push_iteration,
    push_summed,
    retired_learner,
    split_push_pull,
)
from pserver.plan.config import inject_plan
from pserver.roles.shard_inject import ShardInjection
from pserver.roles.shard_pulls import PullAnswers
from pserver.roles.shard_rows import ShardRows, prediction_summary
from pserver.roles.shard_state import BlockBuilder, BlockState, ShardPath, ShardSide
from pserver.roles.shard_versions import summary
from pserver.roles.snapshots import SNAPSHOT_QUEUE_MAX, snapshot_queue
from pserver.runtime.context import Context

__all__ = ["SNAPSHOT_QUEUE_MAX", "BlockState", "ServerShard", "snapshot_queue"]


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
        mine = ctx.blocks_of(self.shard)
        self.payloads = Payloads(ctx.backend, mine, weights.dtype, self.cfg.comm.staging)
        # the serving path, decided here once (shard_state.ShardPath): the mode (plain,
        # predicted or BMUF's; with host staging MPI reads staged copies, which are versioned,
        # else w itself is) and the transport (messages, the window, zero copy)
        self.path = ShardPath.of(ctx.cfg, ctx.rank, ctx.shm, self.payloads.staged)
        self.shm, self.mode = self.path.shm, self.path.mode
        side = ShardSide(ctx.cfg, ctx.layout, ctx.rank, ctx.train_size, ctx.backend, ctx.channels,
                         ctx.now)  # fmt: skip
        build = BlockBuilder(side, self.path, len(self.live))
        self.blocks = build.blocks(mine, weights)
        for st in self.blocks.values():  # a pull answer to a lost learner (issue 22)
            st.versions.absorb = lambda error: ctx.peers.absorb(error, ctx.log)
        self.handlers = {Tag.PUSH: self.on_push, Tag.BYE: self.on_bye, Tag.RETIRE: self.on_retire}
        self.rows = ShardRows(self.records, self.shard, min(self.blocks), ctx.now)
        self.dropped_after_stop = 0
        self.bytes_in = 0
        self.inject = ShardInjection(inject_plan(self.cfg), self.shard, self.live)
        self.pulls = PullAnswers(
            side, self.blocks, self.path, self.payloads, self.inject, self.rows
        )
        self.handlers[Tag.PULL] = self.pulls.on_pull
        self.handlers[Tag.PUSH_PULL] = self.on_push_pull
        if ctx.resume is not None:
            self.restore(ctx.resume.state)

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
                what, also=self.released_or_lost, due=self.next_due(), clock=self.ctx.now
            )
            if header is not None:
                handler = self.handlers.get(header.kind)
                if handler is None:
                    raise WireError(f"server got unexpected {header} from rank {header.sender}")
                started = time.perf_counter()
                handler(header)
                self.inject.slow_down(time.perf_counter() - started)
            self.on_lost()
            self.on_time()
            self.pulls.answer_starved()
            self.records.maybe_send()
        inbox.close()
        self.finish()

    def next_due(self) -> float | None:
        """The earliest protocol timeout (PSP's τ1) or injected delayed reply."""
        dues = [st.arith.protocol.deadline() for st in self.blocks.values()]
        dues.append(self.inject.due())
        return min((d for d in dues if d is not None), default=None)

    def on_time(self) -> None:
        now = self.ctx.now()
        for st in self.blocks.values():
            if st.arith.protocol.deadline() is not None and st.arith.ready(now):
                self.update(st)
        for h in self.inject.released(now):
            self.pulls.answer(h)

    # -- pushes ------------------------------------------------------------------------------

    def on_push(self, h: Header) -> None:
        st = self.blocks[h.block]
        recv = st.arith.inbox()
        if self.shared(h):  # the learner computed it in its slot of our window
            g = self.shm.slot(self.ctx.rank, h.sender, st.block)
            self.shm.sync()
            st.versions.unpin_reader(h.sender)  # done computing: reads none until answered
        else:
            g = recv
            req = self.ch.bulk.Irecv(self.payloads.incoming(h.block, g), h.sender, h.block)
            what = lambda: f"gradient payload of block {h.block} from rank {h.sender}"  # noqa: E731
            self.waiter.wait(req, what)
            if self.gone(h.sender):  # it died sending: its in-flight gradient is lost
                return
            self.payloads.arrived(h.block, g)
        self.bytes_in += g.nbytes
        try:
            self.take_gradient(st, h, g)
        finally:
            st.arith.keep()  # the learner may reuse its slot once we answer its pull

    def on_push_pull(self, h: Header) -> None:
        """A push and the pull that follows it in one header (``Tag.PUSH_PULL``): handled as
        the PUSH, then the PULL, would be. A learner lost sending its gradient asks nothing."""
        push, pull = split_push_pull(h)
        self.on_push(push)
        if not self.gone(h.sender):
            self.pulls.on_pull(pull)

    def shared(self, h: Header) -> bool:
        """Whether this push left its gradient in our shared window (a learner of our node)."""
        return push_summed(h.aux) == 0 and self.path.shared(h.sender)  # not an aggregator's

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
            self.rows.gradient(st.block.index, learner, sent_ts, d.staleness, update)
        if st.arith.ready(now):
            self.update(st)
        elif not taken.accepted and st.arith.epochs.counts_drops:
            self.after_update(st)  # a dropped gradient still consumed a minibatch of the epoch

    def contributions(self, h: Header) -> list[tuple[int, int, int | None]]:
        """(learner, timestamp, iteration tag) of each gradient in a push: one, or an
        aggregator's n (whose pairs carry no iteration: the tree runs the block rule)."""
        n = push_summed(h.aux)
        if n == 0:
            return [(self.ctx.layout.index(h.sender), h.timestamp, push_iteration(h.aux))]
        pairs = np.empty(2 * n, dtype=np.int64)
        self.ch.ctrl.Recv(pairs, h.sender, Tag.CLOCK)
        return [(int(pairs[2 * i]), int(pairs[2 * i + 1]), None) for i in range(n)]

    def update(self, st: BlockState) -> None:
        decision = st.arith.commit()
        # sends read w itself: never under them (copy-on-write); staged or predicted they do not
        into = source = None
        if self.mode.sends_read_w:
            into, source = st.versions.new_version(
                self.waiter, st.arith.w.nbytes, st.arith.fuses_copy
            )
        applied = st.arith.apply(decision, into, source)
        self.rows.update(st.block.index, applied.decision, applied.lr)
        if applied.steps >= 0:
            self.rows.prediction(st.block.index, applied, st.arith.predictor)
        for group, row in applied.rows:  # a strategy's own rows (BMUF's rounds)
            self.records.add(group, shard=self.shard, block=st.block.index, time=self.ctx.now(),
                             **row)
        self.after_update(st)

    def after_update(self, st: BlockState) -> None:
        """Tests at epoch ends (``pserver.protocols.epochs``), then the held pulls."""
        for epoch in st.arith.epoch_ends().tested:
            self.send_snapshot(st, epoch)
        if st.snaps.queued:
            st.snaps.advance()
        self.pulls.answer_waiting(st)

    def on_bye(self, h: Header) -> None:
        self.live.discard(h.sender)
        for st in self.blocks.values():
            # held pulls of a child that left at a cut (an aggregator's long polls, a learner's
            # under the iteration rule, pserver.ckpt.records.partial_pull): STOP, now
            self.pulls.release_departed(st, h.sender)
            # its last loan of a window version: it computes nothing more (pserver.ckpt.drivers.shm)
            st.versions.unpin_reader(h.sender)
        # a learner, or a top aggregator (its subtree's learners, retired already by RETIRE)
        self.retire(departed_learners(self.ctx.layout, h.sender))

    def lost(self) -> list[int]:
        """Learners of ours that died (Open MPI's ULFM, ``pserver.comm.departures``)."""
        d = self.ctx.peers.departures
        return [] if d is None else sorted(self.live & d.lost().keys())

    def gone(self, rank: int) -> bool:
        d = self.ctx.peers.departures
        return d is not None and d.is_lost(rank)

    def released_or_lost(self) -> bool:
        return self.pulls.released() or bool(self.lost())

    def on_lost(self) -> None:
        """A lost learner is a departure without goodbye: its held pulls are forgotten (no
        one reads the answer), its window loans end, and each block's protocol recomputes
        its quorum for λ − 1 (``Protocol.lose``); a round it held back closes now."""
        for rank in self.lost():
            self.live.discard(rank)
            learner = self.ctx.layout.index(rank)
            for st in self.blocks.values():
                self.pulls.forget(st, rank)
                st.versions.unpin_reader(rank)
                st.arith.protocol.lose(learner)
            self.ctx.log.info("learner %d (rank %d) lost: %s from now on", learner, rank,
                              next(iter(self.blocks.values())).arith.protocol.describe())
            self.retire([])

    def on_retire(self, h: Header) -> None:
        """A learner below an aggregator said goodbye (``pserver.ckpt.records.aggregator``)."""
        self.retire([retired_learner(h.aux)])

    def retire(self, learners: list[int]) -> None:
        for st in self.blocks.values():
            for learner in learners:
                st.arith.protocol.retire(learner)
            # a learner stopped by a signal (pserver.runtime.signals) or paused for a periodic
            # checkpoint while the others finish their step: the round they complete no longer
            # waits for it (hardsync's lockstep); once every learner is gone a round below its
            # count (softsync's c) can get no more gradients: it closes with those it has, so
            # no gradient the dump says was taken is lost at the cut
            a = st.arith
            if not a.done and a.in_round and (a.ready(self.ctx.now()) or not self.live):
                self.update(st)
            self.pulls.answer_waiting(st)

    # -- checkpoints (pserver.ckpt.drivers.end, pserver.ckpt.records.shard)
    # -----------------------------

    def state(self) -> State:
        """Every block's state, taken after the loop: every learner has said goodbye."""
        arrays: dict[str, Any] = {}
        blocks: dict[str, Any] = {}
        to_host = host_copy(self.ctx.backend.to_host, self.shm)  # w may lie in the window
        for index, st in self.blocks.items():
            a, attrs = block_state(st.arith, index, to_host)
            arrays.update(a)
            blocks[str(index)] = attrs
        return State(arrays, {"role": "server", "shard": self.shard, "blocks": blocks})

    def restore(self, state: State) -> None:
        copy_in = self.ctx.backend.copy_from_host
        for index, st in self.blocks.items():
            restore_block(st.arith, index, state.arrays, state.attrs["blocks"][str(index)], copy_in)

    # -- end -----------------------------------------------------------------------------------

    def send_snapshot(self, st: BlockState, epoch: int) -> None:
        """The test at an epoch end (``Snapshots``: never waits for the statistics server)."""
        self.records.send()  # the progress line at this epoch then shows current staleness
        st.snaps.send(st.arith.w, epoch, st.arith.ts)

    def finish(self) -> None:
        self.ctx.log.info(summary([st.versions.pool for st in self.blocks.values()]))
        first = self.blocks[min(self.blocks)].arith
        if first.predictor is not None:
            self.ctx.log.info(prediction_summary(first, len(self.ctx.layout.learners)))
        for st in self.blocks.values():
            st.versions.drain(self.waiter)
            st.snaps.drain(st.arith.w, st.arith.ts, self.waiter)
        self.rows.end(
            [(st.block.index, st.block.size, st.arith) for st in self.blocks.values()],
            dropped_after_stop=self.dropped_after_stop,
            wait_time=self.waiter.waited,
            bytes_in=self.bytes_in,
            bytes_out=self.pulls.bytes_out,
            skipped_snapshots=sum(st.snaps.skipped for st in self.blocks.values()),
        )
        self.records.close(self.waiter)
        hdr = Header(Tag.SERVER_BYE, -1, -1, self.ctx.rank).pack(self.out[0])
        self.records.bye(hdr, Tag.SERVER_BYE, self.waiter)
