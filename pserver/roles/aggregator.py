"""Aggregator: a node of Rudra-adv's parameter-server tree (Gupta et al. §III-C, Fig. 2).

Upwards, it sums one gradient per live child for each block and relays the sum with every
child's (learner, timestamp) pairs, so the root records exact vector clocks and staleness.
Downwards, it keeps a long poll open at its parent for each block, caches the newest weights
(one timestamp everywhere in the tree) and answers its children's pulls from that cache, so the
root sends each new model once per child rather than once per learner.

Children are served from versions (``pserver.protocols.versions``): a send to a child pins the
version it
reads, the parent's next weights land in a buffer no send reads, and a child that does not call
into MPI (slow, stopped) keeps only its own version: the aggregator never waits for it.

At a checkpoint's cut (its record: ``pserver.ckpt.records.aggregator``):

**No gradient lost or applied twice.** A learner stops at a step boundary (a signal, a periodic
pause: ``pserver.roles.trainer``) with every push sent and says goodbye to its aggregator after
the answers to its last pulls. An aggregator relays a round once every live child has pushed;
a goodbye shrinks the live set, so the round that waited for the child that left is relayed at
its goodbye (``Aggregator.on_bye``), and when the last child leaves every partial sum is relayed
(an empty live set is a subset of any round). The aggregator's loop ends only then, and its
goodbye to its parent goes on the control communicator after the pushes it relayed: the parent
reads a sender's headers in order, so it has every relayed gradient before it reads the
goodbye, and a shard's loop ends only after every top aggregator's goodbye. So when a shard
saves, every gradient a learner computed on is in the shard's weights, in a round it still has
open (closed on the last goodbye, as in a flat run: ``ServerShard.retire``), or dropped and
counted by the protocol: none is in an aggregator. Nothing is sent again on resume, so nothing
is applied twice.

**Learners retire through the tree.** Hardsync's round waits for every learner that has not
said goodbye (``Rounds.retire``). A flat shard hears each learner's goodbye; in a tree it hears
only the top aggregators', at their very end. A learner stopped a step before another would
leave the other's next round waiting at the shard for a gradient that never comes, while the
aggregator waits for that other learner's goodbye, which waits for the round: a cycle. So when
a learner says goodbye to its aggregator, the aggregator sends its parents ``Tag.RETIRE`` with
the learner's index (after relaying the round the goodbye completed), every aggregator above
relays it, and the shard retires the learner from its rounds as it does at a flat goodbye. The
learner said goodbye only after the answers to its last pulls, i.e. after every round holding
its gradient closed, so the retirement never closes a round without a gradient on its way.

**Nothing waits forever.** An aggregator keeps a long poll out at its parent for each block; at
a cut the parent is not done and would hold it until an update that may never come. The
aggregator therefore says goodbye *first* and then collects exactly one answer per long poll:
either the parent answered before it read the goodbye (weights, received and dropped: the
parent's state holds them), or it answers at the goodbye with ``Reply.STOP`` to every pull the
departed child left held (``PullAnswers.release_departed`` at a shard,
:meth:`Aggregator.child_left` at an aggregator). Every child of an aggregator leaves (a learner
reaches its step boundary: it waits only for answers that a closing round gives, see above; an
aggregator by induction from the leaves), so every loop ends, every rank reaches the
checkpoint's agreement (``pserver.ckpt.drivers.end``). Every wait goes through the ``Waiter``
(back-off, stall report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver.ckpt.files import State
from pserver.ckpt.records.aggregator import NOT_CACHED, AggregatorRecord
from pserver.comm.doorbell import ring
from pserver.comm.inbox import Inbox
from pserver.comm.payload import Payloads
from pserver.comm.wire import (
    Header,
    Reply,
    Tag,
    WireError,
    header_buffer,
    pull_aux,
    pull_oldest,
    push_summed,
    reply_aux,
    reply_kind,
    reply_tag,
    retire_aux,
    retired_learner,
    sum_aux,
)
from pserver.plan.topology import Block, Role
from pserver.protocols.pull import pull_answer
from pserver.protocols.tree import add_gradient
from pserver.protocols.versions import VersionPool, release_completed
from pserver.runtime.context import Context


@dataclass
class Relay:
    """One block's state at an aggregator."""

    block: Block
    parent: int
    bufs: list[Any]  # weight versions, indexed as in ``pool``
    pool: VersionPool  # current: served to the children; ``incoming``: the parent's next weights
    recv: Any  # a child's gradient
    total: Any  # sum of this round's gradients
    ts: int = 0  # timestamp of ``w`` (0: w0, which every rank builds from run.seed)
    stopped: bool = False
    got: set[int] = field(default_factory=set)  # children that pushed this round
    clock: list[int] = field(default_factory=list)  # (learner, timestamp) pairs, flattened
    waiting: list[Header] = field(default_factory=list)  # children's held pulls
    starved: list[Header] = field(default_factory=list)  # pulls held until a version is free
    serving: list[tuple[MPI.Request, int]] = field(default_factory=list)  # (send, pool ticket)
    forwarding: list[MPI.Request] = field(default_factory=list)  # the sum going up
    outgoing: Any = None  # what MPI sends ``w`` from (itself, or its staged host copy)
    incoming: int = -1  # the version the parent's next weights land in
    asked: MPI.Request | None = None
    posted: MPI.Request | None = None

    @property
    def w(self) -> Any:
        """The cached weights served to the children."""
        return self.bufs[self.pool.current]


class Aggregator:
    def __init__(self, ctx: Context, weights: Any) -> None:
        self.ctx, self.xp, self.ch = ctx, ctx.xp, ctx.channels
        self.waiter = ctx.waiter()
        self.records = ctx.records()
        lay = ctx.layout
        self.children = set(lay.children(ctx.rank))
        self.live = set(self.children)
        self.relays = {
            b.index: self.make_relay(b, lay.upstream(ctx.rank, lay.servers[b.shard]), weights)
            for b in ctx.blocks
        }
        staging = ctx.cfg.comm.staging
        self.up = Payloads(ctx.backend, ctx.blocks, weights.dtype, staging)  # gradient sums
        self.down = Payloads(ctx.backend, ctx.blocks, weights.dtype, staging)  # weights
        for r in self.relays.values():
            r.outgoing = self.down.outgoing_version(r.block.index, r.pool.current, r.w)
        self.out = header_buffer()
        self.replies = header_buffer(len(ctx.blocks))
        self.clockbuf = np.empty(0, dtype=np.int64)
        self.bytes_in = self.bytes_out = 0
        self.handlers = {Tag.PUSH: self.on_push, Tag.PULL: self.on_pull, Tag.BYE: self.on_bye,
                         Tag.RETIRE: self.on_retire}
        if ctx.resume is not None:  # checkpoints: pserver.ckpt.records.aggregator
            self.restore(ctx.resume.state)

    def make_relay(self, b: Block, parent: int, weights: Any) -> Relay:
        """Versions: ``comm.versions`` (0: one per child + the served one), plus the buffer the
        parent's next weights arrive in."""
        xp, n = self.xp, b.size
        w0 = xp.array(weights[b.start : b.stop], dtype=weights.dtype)
        limit = (self.ctx.cfg.comm.versions or 1 + len(self.children)) + 1
        return Relay(
            b, parent, [w0], VersionPool(limit),
            xp.empty(n, weights.dtype), xp.empty(n, weights.dtype),
        )

    def run(self) -> None:
        for r in self.relays.values():
            self.ask(r)
        inbox = Inbox(self.ch.ctrl, self.waiter, self.ctx.peers)
        what = lambda: f"children {sorted(self.live)} or the parent"  # noqa: E731
        while self.live:
            h = inbox.next(what, also=lambda: self.parent_replies() or self.released())
            if h is not None:
                handler = self.handlers.get(h.kind)
                if handler is None:
                    raise WireError(f"aggregator got unexpected {h} from rank {h.sender}")
                handler(h)
            self.answer_starved()
            self.records.maybe_send()
        inbox.close()
        self.finish()

    # -- downwards: the parent's weights and the children's pulls ----------------------------

    def ask(self, r: Relay) -> None:
        """Long poll: the parent answers with the first weights newer than ours (or STOP)."""
        b = r.block
        r.incoming = r.pool.reserve()
        if r.incoming is None:  # VersionPool.may_pin leaves one after every publish
            raise RuntimeError(f"no free version of block {b.index} for the parent's weights")
        while len(r.bufs) < r.pool.allocated:
            r.bufs.append(self.xp.empty_like(r.bufs[0]))
        w_in = r.bufs[r.incoming]
        r.posted = self.ch.bulk.Irecv(self.down.incoming(b.index, w_in), r.parent, b.index)
        hdr = Header(Tag.PULL, b.index, r.ts, self.ctx.rank, pull_aux(r.ts + 1))
        self.ch.ctrl.Send(hdr.pack(self.out[0]), r.parent, Tag.PULL)
        row = self.replies[b.index]
        r.asked = self.ch.down.Irecv(row, r.parent, reply_tag(b.index))

    def parent_replies(self) -> bool:
        changed = False
        for r in self.relays.values():
            if r.asked is not None and r.asked.Test():
                r.asked = None
                self.on_parent_reply(r)
                changed = True
        return changed

    def on_parent_reply(self, r: Relay) -> None:
        h = Header.unpack(self.replies[r.block.index])
        self.ctx.peers.note(h.sender, h)
        kind = reply_kind(h.aux)
        if kind == Reply.STOP:
            r.stopped = True
        elif kind == Reply.WEIGHTS:
            self.waiter.wait(r.posted, f"weights of block {r.block.index} from the parent")
            r.posted = None
            self.down.arrived(r.block.index, r.bufs[r.incoming])
            self.bytes_in += r.w.nbytes
            self.collect(r)
            r.pool.publish(r.incoming)  # the new weights are served; the old stay for their sends
            r.ts = h.timestamp
            # staged once, sent to every child (a staged copy per version: sends may read it)
            r.outgoing = self.down.outgoing_version(r.block.index, r.pool.current, r.w)
            self.ask(r)
        else:
            raise WireError(f"unexpected reply {h} to a long poll")
        waiting, r.waiting = r.waiting, []
        for pull in waiting:
            self.on_pull(pull)

    def on_pull(self, h: Header) -> None:
        r = self.relays[h.block]
        oldest = pull_oldest(h.aux)
        answer = pull_answer(stopped=r.stopped, ts=r.ts, holds=h.timestamp, accepts=oldest)
        if answer is None or (r.ts == NOT_CACHED and answer is not Reply.STOP):
            r.waiting.append(h)
        elif answer is not Reply.WEIGHTS:
            self.reply(h.sender, r, answer)
        elif not (r.pool.may_pin() or (self.collect(r) and r.pool.may_pin())):
            r.starved.append(h)  # only this pull waits for a version to be released
        else:
            self.reply(h.sender, r, Reply.WEIGHTS)
            req = self.ch.bulk.Isend(r.outgoing, h.sender, r.block.index)
            r.serving.append((req, r.pool.pin()))
            self.bytes_out += r.w.nbytes

    def collect(self, r: Relay) -> bool:
        """Release the versions read by sends to children that completed; True if any did."""
        return release_completed(r.serving, r.pool)

    def released(self) -> bool:
        """Whether a pull held for lack of a version may go now (polled while idle)."""
        for r in self.relays.values():
            if r.starved:
                self.collect(r)
                if r.pool.may_pin():
                    return True
        return False

    def answer_starved(self) -> None:
        for r in self.relays.values():
            if r.starved and r.pool.may_pin():
                starved, r.starved = r.starved, []
                for h in starved:
                    self.on_pull(h)

    def reply(self, dest: int, r: Relay, kind: Reply) -> None:
        Header(Tag.REPLY, r.block.index, r.ts, self.ctx.rank, reply_aux(kind)).pack(self.out[0])
        self.ch.down.Send(self.out[0], dest, reply_tag(r.block.index))
        ring(dest)  # the child's pull sleeps on its doorbell (PSExchange.pull)

    # -- upwards: the children's gradients -----------------------------------------------------

    def on_push(self, h: Header) -> None:
        r = self.relays[h.block]
        inbox = self.up.incoming(h.block, r.recv)
        self.waiter.wait(self.ch.bulk.Irecv(inbox, h.sender, h.block), "a child's gradient")
        self.up.arrived(h.block, r.recv)
        self.bytes_in += r.recv.nbytes
        pairs = self.child_clock(h)
        if r.stopped:
            return  # training is over: the server would drop it too
        if not r.got:  # the first of a round is swapped in as the sum: the last one must be sent
            self.drain(r.forwarding, "the previous sum to reach the parent")
        r.total, r.recv = add_gradient(self.xp, r.total, r.recv, first=not r.got)
        r.got.add(h.sender)  # a fast child may push twice in a round: both are summed and clocked
        r.clock.extend(pairs)
        self.maybe_forward(r)

    def child_clock(self, h: Header) -> list[int]:
        n = push_summed(h.aux)
        if n == 0:  # a learner's own push (the tree runs the block rule: no iteration tag)
            return [self.ctx.layout.index(h.sender), h.timestamp]
        if self.clockbuf.size != 2 * n:
            self.clockbuf = np.empty(2 * n, dtype=np.int64)
        self.ch.ctrl.Recv(self.clockbuf, h.sender, Tag.CLOCK)
        return self.clockbuf.tolist()

    def maybe_forward(self, r: Relay) -> None:
        """Relay the round once every live child has pushed (a child that left is not awaited)."""
        if not r.got or not self.live <= r.got:
            return
        b, n = r.block, len(r.clock) // 2
        hdr = Header(Tag.PUSH, b.index, -1, self.ctx.rank, sum_aux(n))
        self.ch.ctrl.Send(hdr.pack(self.out[0]), r.parent, Tag.PUSH)
        self.ch.ctrl.Send(np.asarray(r.clock, dtype=np.int64), r.parent, Tag.CLOCK)
        buf = self.up.outgoing(b.index, r.total)
        r.forwarding.append(self.ch.bulk.Isend(buf, r.parent, b.index))
        self.bytes_out += r.total.nbytes
        r.got, r.clock = set(), []

    def on_bye(self, h: Header) -> None:
        self.live.discard(h.sender)
        for r in self.relays.values():
            if not r.stopped:
                self.maybe_forward(r)
        self.child_left(h.sender)  # its held pulls answered, a learner retired upwards

    # -- end ---------------------------------------------------------------------------------

    def drain(self, reqs: list[MPI.Request], what: str) -> None:
        self.waiter.waitall(reqs, what)
        reqs.clear()

    def finish(self) -> None:
        for r in self.relays.values():
            self.drain([q for q, _ in r.serving], "weight sends to children")
            r.serving.clear()
            self.drain(r.forwarding, "the last sum to reach the parent")
        self.leave()  # goodbye first: a parent not done answers our long polls at it
        self.records.add(
            "aggregators", aggregator=self.ctx.layout.index(self.ctx.rank), rank=self.ctx.rank,
            bytes_in=self.bytes_in, bytes_out=self.bytes_out, wait_time=self.waiter.waited,
            **self.records.usage(),
        )
        self.records.close(self.waiter)
        bye = Header(Tag.BYE, -1, -1, self.ctx.rank).pack(self.out[0])
        self.records.bye(bye, Tag.BYE, self.waiter)

    # -- a checkpoint's cut (the module docstring) ------------------------------------------

    def parents(self) -> list[int]:
        return sorted({r.parent for r in self.relays.values()})

    def send_retire(self, learner: int) -> None:
        """Tell every parent that ``learner`` computes no more (hardsync's rounds stop
        waiting)."""
        hdr = Header(Tag.RETIRE, -1, -1, self.ctx.rank, retire_aux(learner)).pack(self.out[0])
        for parent in self.parents():
            self.ch.ctrl.Send(hdr, parent, Tag.RETIRE)

    def on_retire(self, h: Header) -> None:
        """A child aggregator's learner retired: relay it upwards."""
        self.send_retire(retired_learner(h.aux))

    def child_left(self, child: int) -> None:
        """After a child's goodbye (its last round relayed): STOP to the pulls it left held (a
        child aggregator's long polls), and its retirement upwards if it is a learner."""
        for r in self.relays.values():
            for held in (r.waiting, r.starved):
                mine = [p for p in held if p.sender == child]
                if mine:
                    held[:] = [p for p in held if p.sender != child]
                    for _ in mine:
                        self.reply(child, r, Reply.STOP)
        lay = self.ctx.layout
        if lay.role(child) is Role.LEARNER:
            self.send_retire(lay.index(child))

    def leave(self) -> None:
        """Say goodbye to every parent, then collect the one answer each long poll still gets
        (weights sent before the parent read the goodbye, or its STOP): never ask again."""
        bye = Header(Tag.BYE, -1, -1, self.ctx.rank).pack(self.out[0])
        for parent in self.parents():
            self.ch.ctrl.Send(bye, parent, Tag.BYE)
        for r in self.relays.values():
            if r.asked is not None:
                self.waiter.wait(r.asked, f"the parent's last reply for block {r.block.index}")
                r.asked = None
                h = Header.unpack(self.replies[r.block.index])
                self.ctx.peers.note(h.sender, h)
                kind = reply_kind(h.aux)
                if kind == Reply.WEIGHTS:  # the parent's state holds them: received, not served
                    self.waiter.wait(r.posted, f"weights of block {r.block.index} from the parent")
                    r.posted = None
                    self.bytes_in += r.w.nbytes
                elif kind != Reply.STOP:
                    raise WireError(f"unexpected reply {h} to a long poll")
                r.stopped = True
            if r.posted is not None:
                r.posted.Cancel()
                r.posted.Wait()
                r.posted = None

    def state(self) -> State:
        """Its byte counts and children (the cut leaves it nothing else to keep)."""
        children = tuple(sorted(self.children))
        return AggregatorRecord(children, self.bytes_in, self.bytes_out).to_state()

    def restore(self, saved: State) -> None:
        """Resume with nothing cached: children wait for the parent's (checkpointed) model."""
        record = AggregatorRecord.from_state(saved)
        self.bytes_in, self.bytes_out = record.bytes_in, record.bytes_out
        for r in self.relays.values():
            r.ts = NOT_CACHED
