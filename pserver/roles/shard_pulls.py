"""A shard's pull answers: the one pull-answer rule applied, and the replies that carry weights.

:class:`PullAnswers` is the part of :class:`~pserver.roles.server.ServerShard` that answers
pulls (split from it by job, behaviour unchanged): whether a pull goes now, waits for the next
update (``waiting_pulls``) or for a free version (``starved``), and how weights travel (a send
of the current or staged version, a shared-window copy or a zero-copy loan). The rule itself is
``pserver.protocols.pull.pull_answer``; the versions are ``shard_versions``'.
"""

from __future__ import annotations

import numpy as np

from pserver.comm import doorbell
from pserver.comm.payload import Payloads
from pserver.comm.wire import Header, Reply, Tag, header_buffer, pull_oldest, reply_aux, reply_tag
from pserver.protocols.pull import pull_answer
from pserver.roles.shard_inject import ShardInjection
from pserver.roles.shard_rows import ShardRows
from pserver.roles.shard_state import BlockState, ShardPath, ShardSide


class PullAnswers:
    """Held pulls and replies of a shard (see the module docstring), given what they read:
    the run's side of the shard (``ShardSide``: layout, rank, clock, channels, backend), the
    shard's blocks, its serving path (``ShardPath``: mode and transport, decided once), its
    payload buffers, its injected delays and its dump rows."""

    def __init__(
        self,
        side: ShardSide,
        blocks: dict[int, BlockState],
        path: ShardPath,
        payloads: Payloads,
        inject: ShardInjection,
        rows: ShardRows,
    ) -> None:
        self.side, self.ch, self.blocks, self.path = side, side.channels, blocks, path
        self.inject, self.rows, self.payloads = inject, rows, payloads
        self.shm, self.mode = path.shm, path.mode
        self.out = header_buffer()
        self.ack = np.empty(0, dtype=np.int8)  # shared-window copies are acknowledged empty
        self.bytes_out = 0

    def released(self) -> bool:
        """Whether a pull held for lack of a version may go now (polled while idle)."""
        for st in self.blocks.values():
            if st.starved:
                st.versions.collect()
                if st.versions.pool.may_pin():
                    return True
        return False

    def answer_starved(self) -> None:
        for st in self.blocks.values():
            if st.starved and st.versions.pool.may_pin():
                starved, st.starved = st.starved, []
                for h in starved:
                    self.answer(h)

    def answer_waiting(self, st: BlockState) -> None:
        waiting, st.waiting_pulls = st.waiting_pulls, []
        for h in waiting:
            self.answer(h)

    def release_departed(self, st: BlockState, sender: int) -> None:
        """STOP to the pulls ``sender`` left held when it said goodbye, now: an aggregator
        leaves a cut with its long polls out (``pserver.ckpt.records.aggregator``), and a learner
        under the iteration rule says goodbye before collecting its last answers
        (``pserver.ckpt.records.partial_pull``: they may ask for rounds only learners stopping too
        could fill). Other learners say goodbye with no pull held: nothing to do."""
        held = [h for h in st.waiting_pulls + st.starved if h.sender == sender]
        held += self.inject.withdraw(sender, st.block.index)
        st.waiting_pulls = [h for h in st.waiting_pulls if h.sender != sender]
        st.starved = [h for h in st.starved if h.sender != sender]
        for _ in held:
            self.reply(sender, st, Reply.STOP)

    def forget(self, st: BlockState, sender: int) -> None:
        """Drop the pulls a lost learner left held (issue 22): nobody is there to answer."""
        self.inject.withdraw(sender, st.block.index)
        st.waiting_pulls = [h for h in st.waiting_pulls if h.sender != sender]
        st.starved = [h for h in st.starved if h.sender != sender]

    def on_pull(self, h: Header) -> None:
        learner = self.side.layout.index(h.sender)
        request, delay = self.inject.delay(h, learner, self.side.now())
        if delay > 0.0:  # a rare, large delay of this reply only (PSP-SGD §4.2)
            self.rows.delay(learner, h.block, request, delay)
        else:
            self.answer(h)

    def answer(self, h: Header) -> None:
        """Rudra's timestamp inquiry: weights go out only when newer than the learner's copy.

        A pull is held while the block is older than the learner asks for (hardsync and PSP:
        the next update) or while the protocol holds the learner back (SSP's bound). A pull that
        would read the current version is also held, alone, while serving it would leave no
        free version for the next update (``VersionPool.may_pin``); a release lets it go.
        """
        st = self.blocks[h.block]
        reads = self.path.lends(h.sender)  # computes on the version
        a = st.arith
        ready = lambda: a.protocol.pull_ready(self.side.layout.index(h.sender))  # noqa: E731
        oldest = pull_oldest(h.aux)
        answer = pull_answer(
            stopped=a.done, ts=a.ts, holds=h.timestamp, accepts=oldest, ready=ready, reads=reads
        )
        if answer is None:
            st.waiting_pulls.append(h)
        elif answer is not Reply.WEIGHTS:
            self.reply(h.sender, st, answer)
        else:
            if self.mode.staged and st.versions.staged_ts != a.ts:
                self.stage(st)  # once per update, however many learners pull it
            elif self.mode.produced and st.versions.served_ts != a.ts:
                st.versions.produce(a.serve, a.ts)  # f_S(w, M), once per update
            if not st.versions.can_pin():
                st.starved.append(h)
            elif reads:
                self.lend(h, st)
            else:
                self.send_weights(h.sender, st)

    def lend(self, h: Header, st: BlockState) -> None:
        """Shared-window zero copy: the learner computes on the current version in place, which
        stays pinned (not written) until its next push."""
        v, a = st.versions, st.arith
        v.pin_reader(h.sender)
        current = a.ts == h.timestamp
        if not current:
            self.shm.sync()  # our update is visible before the reply that announces it
            self.bytes_out += a.w.nbytes
        self.reply(h.sender, st, Reply.CURRENT if current else Reply.WEIGHTS, v.pool.current)

    def send_weights(self, dest: int, st: BlockState) -> None:
        """Reply with the current version; the send (or the window copy's acknowledgement)
        pins that version until it completes."""
        b, v = st.block.index, st.versions
        if self.path.shared(dest):  # the learner copies the version out, then acknowledges
            self.shm.sync()
            self.reply(dest, st, Reply.WEIGHTS, v.pool.current)
            req = self.ch.ack.Irecv(self.ack, dest, b)
        else:
            self.reply(dest, st, Reply.WEIGHTS, ring=False)
            # MPI must not read a busy device
            if not self.mode.staged and v.staged_ts != st.arith.ts:
                self.side.backend.synchronize()
                v.staged_ts = st.arith.ts
            req = self.ch.bulk.Isend(v.current, dest, b)
            # rung once the payload is posted too: a learner woken by the header alone would
            # sleep again with the payload unread, and our send (the version it pins) would
            # wait for its next wake-up
            doorbell.ring(dest)
        v.pin_send(req)
        self.bytes_out += st.arith.w.nbytes

    def stage(self, st: BlockState) -> None:
        """Copy the served model to a staged host version no send reads (never waits)."""
        b, a = st.block.index, st.arith
        st.versions.stage(lambda v: self.payloads.outgoing_version(b, v, a.serve()), a.ts)

    def reply(
        self, dest: int, st: BlockState, kind: Reply, version: int = 0, ring: bool = True
    ) -> None:
        hdr = Header(
            Tag.REPLY, st.block.index, st.arith.ts, self.side.rank, reply_aux(kind, version)
        )
        hdr.pack(self.out[0])
        self.ch.down.Send(self.out[0], dest, reply_tag(st.block.index))
        if ring:  # the learner's pull sleeps on its doorbell (PSExchange.pull)
            doorbell.ring(dest)
