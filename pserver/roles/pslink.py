"""A learner's side of the parameter servers, shared by both PS exchanges.

Where each block's gradient goes (its shard, or our aggregator in a tree) and where its weights
come from (the same rank, or a parent learner in a broadcast tree); the requests a learner has
out (weight payload receives into the communication buffer ``w_comm``, reply headers, gradient
sends); the decoding of a reply header; the posting of a push; the goodbye. The exchanges
(:mod:`pserver.roles.learner`, :mod:`pserver.roles.overlap`) decide when to ask and what an
answer means; this object only moves the messages.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from pserver.comm.payload import Payloads
from pserver.comm.wire import Header, Tag, WireError, header_buffer, pull_aux, push_aux, reply_tag
from pserver.plan.topology import Block
from pserver.roles.exchange import LearnerSide


class PSLink:
    def __init__(self, side: LearnerSide, weights: Any) -> None:
        self.side, self.xp, self.ch = side, side.xp, side.channels
        self.blocks = side.blocks
        self.by_index = {b.index: b for b in self.blocks}
        lay = side.layout
        self.owner = {b.index: lay.upstream(side.rank, lay.servers[b.shard]) for b in self.blocks}
        self.source = dict(self.owner)  # where weights come from (a learner, with a bcast tree)
        self.shard_of = {b.index: lay.servers[b.shard] for b in self.blocks}
        self.w = self.xp.asarray(weights)  # compute buffer: w0, replaced by the first new model
        self.w_comm = self.xp.empty_like(self.w)
        self.payloads = Payloads(side.backend, self.blocks, self.w.dtype, side.cfg.comm.staging)
        # timestamp of each block we hold: every rank builds w0 from run.seed (cli.run), so a
        # learner starts on timestamp 0 without pulling it (λ copies of the model at startup)
        self.have = {b.index: 0 for b in self.blocks}
        self.stopped: set[int] = set()
        self.posted: dict[int, MPI.Request] = {}  # weight payload receives, into w_comm
        self.asked: dict[int, MPI.Request] = {}  # reply headers still outstanding
        self.pushing: list[MPI.Request] = []  # gradient sends reading a gradient buffer
        self.replies = header_buffer(len(self.blocks))
        self.out = header_buffer()

    def live(self) -> list[Block]:
        return [b for b in self.blocks if b.index not in self.stopped]

    def all_stopped(self) -> bool:
        return len(self.stopped) == len(self.blocks)

    def ask(self, b: Block, oldest: int, payload: bool = True) -> None:
        """Send a pull request (Rudra's timestamp inquiry) for weights newer than ``oldest``;
        post the receive of the answer (and of its payload unless ``payload`` is False: shm)."""
        src = self.source[b.index]
        self.post_payload(b, payload)
        hdr = Header(Tag.PULL, b.index, self.have[b.index], self.side.rank, pull_aux(oldest))
        self.ch.ctrl.Send(hdr.pack(self.out[0]), src, Tag.PULL)
        self.post_reply(b)

    def post_payload(self, b: Block, payload: bool) -> None:
        """The receive of a WEIGHTS answer's payload, posted before the pull goes out (it
        stays posted between pulls until a WEIGHTS answer fills it)."""
        if payload and b.index not in self.posted:
            buf = self.payloads.incoming(b.index, self.w_comm[b.start : b.stop])
            self.posted[b.index] = self.ch.bulk.Irecv(buf, self.source[b.index], b.index)

    def post_reply(self, b: Block) -> None:
        row = self.replies[self.blocks.index(b)]
        self.asked[b.index] = self.ch.down.Irecv(row, self.source[b.index], reply_tag(b.index))

    def upstream(self) -> set[int]:
        """The ranks replies come from (shards, aggregators, a relaying learner)."""
        return set(self.source.values())

    def answered(self) -> list[Block]:
        """The blocks whose reply header arrived (their requests are no longer outstanding)."""
        done = [index for index, req in list(self.asked.items()) if req.Test()]
        for index in done:
            del self.asked[index]
        return [self.by_index[i] for i in done]

    def reply(self, b: Block) -> Header:
        """The reply header that arrived for block ``b``, checked."""
        h = Header.unpack(self.replies[self.blocks.index(b)])
        self.side.peers.note(h.sender, h)
        if h.kind is not Tag.REPLY or h.block != b.index:
            raise WireError(f"learner expected a reply for block {b.index}, got {h}")
        return h

    def payload_request(self, b: Block) -> MPI.Request:
        """The payload receive of block ``b``'s WEIGHTS reply (wait for it, then ``arrived``)."""
        return self.posted.pop(b.index)

    def arrived(self, b: Block) -> None:
        self.payloads.arrived(b.index, self.w_comm[b.start : b.stop])

    def push(
        self,
        b: Block,
        grad: Any,
        iteration: int | None = None,
        payload: bool = True,
        oldest: int | None = None,
    ) -> None:
        """Announce block ``b``'s gradient (timestamp: the weights it was computed from; the
        learner's iteration tag under the iteration rule, else None) and send it unless
        ``payload`` is False (shm: the shard reads it in its window).

        ``oldest``: also ask for the block's weights newer than that (:meth:`ask`), in the same
        header (``Tag.PUSH_PULL``); only for a block whose owner is its shard and its source
        (:meth:`joins_pull`), under the block rule."""
        if oldest is not None:
            if iteration is not None or not self.joins_pull(b):
                raise ValueError(f"block {b.index}: a push and its pull cannot share a header")
            self.post_payload(b, payload)
            hdr = Header(Tag.PUSH_PULL, b.index, self.have[b.index], self.side.rank,
                         pull_aux(oldest))  # fmt: skip
        else:
            hdr = Header(
                Tag.PUSH, b.index, self.have[b.index], self.side.rank, push_aux(iteration)
            )
        self.ch.ctrl.Send(hdr.pack(self.out[0]), self.owner[b.index], hdr.kind)
        if payload:
            buf = self.payloads.outgoing(b.index, grad[b.start : b.stop])
            self.pushing.append(self.ch.bulk.Isend(buf, self.owner[b.index], b.index))
        if oldest is not None:
            self.post_reply(b)

    def joins_pull(self, b: Block) -> bool:
        """Whether block ``b``'s push and pull may share a header: both go to its shard itself
        (no aggregator or relaying learner between, which read only PUSH and PULL)."""
        return self.owner[b.index] == self.source[b.index] == self.shard_of[b.index]

    def install(self, fresh: list[Block]) -> None:
        """Make the blocks that arrived in ``w_comm`` the compute buffer's."""
        if len(fresh) == len(self.blocks) and not self.posted:
            self.w, self.w_comm = self.w_comm, self.w  # whole new model: pointer swap
            return
        for b in fresh:  # some blocks only: copy them; receives may still target w_comm
            self.xp.copyto(self.w[b.start : b.stop], self.w_comm[b.start : b.stop])

    def goodbye(self) -> None:
        """Cancel the idle payload receives and say goodbye to every upstream rank."""
        self.cancel_posted()
        self.say_bye()

    def cancel_posted(self) -> None:
        """Cancel the idle payload receives (no WEIGHTS answer will fill them)."""
        for req in self.posted.values():
            req.Cancel()
        MPI.Request.Waitall(list(self.posted.values()))
        self.posted.clear()

    def say_bye(self) -> None:
        """Goodbye to every upstream rank (after ``cancel_posted``, or at a cut under the
        iteration rule before collecting the answers, ``PSExchange.leave``)."""
        bye = Header(Tag.BYE, -1, -1, self.side.rank).pack(self.out[0])
        for upstream in sorted(set(self.owner.values()) | set(self.source.values())):
            self.ch.ctrl.Send(bye, upstream, Tag.BYE)
