"""A learner's children in the broadcast tree (Rudra-adv*, ``cluster.bcast_fanout``).

A learner with children answers their pulls from the model it computes with. Children are
served from versions of the model (:mod:`pserver.protocols.versions`): a send pins the version it
reads,
so installing a new model never waits for a slow or stopped child; a pull that finds no free
version is held (only that pull waits) and served whenever a version is released. A pull for
weights newer than ours waits until we install them; a stopped block answers STOP.

Checkpoints (a signal, a periodic pause: ``pserver.ckpt.drivers.end``). Gradients go from every
learner straight to its shard or aggregator, so a relaying learner holds no gradient at a cut:
only its children's pulls. It stops at a step boundary with its pushes delivered and the answers
to its last pulls collected but not installed; it computes, and so installs, nothing more. A
child waiting for a model newer than ours would wait for ever: under hardsync or PSP that model
needs our next gradient or our retirement from the rounds, our goodbye to the shards, which we
send only once every child said goodbye. So from our cut on (:meth:`Children.leave`) a pull we
would hold is answered ``Reply.LEFT``; a pull our installed model answers is served as before
(a child behind us catches up to our model). A child takes LEFT as its own cut
(``OverlapExchange.ended``): it computes nothing more, ends its part with its pushes delivered,
answers its own children LEFT in turn and says goodbye. LEFT is not STOP: the child's pipeline
records no push as dropped (``pserver.ckpt.records.pipeline``), so nothing is sent twice on resume;
its
unanswered block is asked again then, and we install our saved answer at our first minibatch
and serve it. Async and n-softsync children ask for weights of any age, which we never hold:
they stop at their own cut. Liveness: we wait for our last answers (rounds close once every
learner pushed or retired) and then for goodbyes, and every child reaches one, by itself or
at the LEFT its next held pull gets. No gradient passes through us, so none is lost or doubled.
A child stops at our round or before it, so with λ > 1 (a broadcast tree needs two learners
under one upstream) a cut can close a round with fewer gradients: the resumed run learns as
the uninterrupted one, not bit for bit (tests/test_mpi_ckpt_tree.py).
"""

from __future__ import annotations

from mpi4py import MPI

from pserver.comm.doorbell import ring
from pserver.comm.payload import Payloads
from pserver.comm.wire import (
    Header,
    Reply,
    Tag,
    WireError,
    header_buffer,
    pull_oldest,
    reply_aux,
    reply_tag,
)
from pserver.plan.topology import Block
from pserver.protocols.pull import pull_answer
from pserver.protocols.versions import VersionPool, release_completed
from pserver.roles.exchange import LearnerSide
from pserver.roles.pslink import PSLink


class Children:
    def __init__(self, side: LearnerSide, link: PSLink) -> None:
        self.side, self.ch, self.link, self.xp = side, side.channels, link, side.xp
        self.kids = {r for r, p in side.layout.bcast_parent.items() if p == side.rank}
        self.live = set(self.kids)
        self.hbuf = header_buffer()
        self.waiting: list[Header] = []  # pulls for weights newer than ours
        self.serving: list[tuple[MPI.Request, int]] = []  # (weight send to a child, ticket)
        self.starved: list[Header] = []  # pulls held until a version is free
        limit = (side.cfg.comm.versions or 1 + len(self.kids)) + 1  # + the one pulled into
        self.pool = VersionPool(limit)
        self.bufs = [link.w, link.w_comm]
        self.incoming = self.pool.reserve()  # w_comm: where the next model arrives
        self.relay = Payloads(side.backend, link.blocks, link.w.dtype, side.cfg.comm.staging)
        self.relayed_bytes = 0
        self.leaving = False  # we stopped at a cut: a pull we would hold is answered LEFT

    def progress(self) -> bool:
        """Release finished sends, serve held pulls, read the children's messages; True when
        a message was read."""
        self.collect()
        if self.starved and self.pool.may_pin():  # whoever released the version
            starved, self.starved = self.starved, []
            for h in starved:
                self.serve(h)
        changed = False
        while self.live:
            # a matched probe, not a posted ANY_SOURCE Irecv, which MPICH's UCX netmod loses
            # across hosts (docs/architecture.md, "Wildcard receives"); a header is eager-sized,
            # so once matched its receive completes at once
            msg = self.ch.ctrl.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            if msg is None:
                break
            msg.Recv(self.hbuf)
            self.on_message(Header.unpack(self.hbuf[0]))
            changed = True
        return changed

    def on_message(self, h: Header) -> None:
        self.side.peers.note(h.sender, h)
        if h.kind is Tag.BYE:
            self.live.discard(h.sender)
        elif h.kind is Tag.PULL:
            self.serve(h)
        else:
            raise WireError(f"learner got unexpected {h} from rank {h.sender}")

    def serve(self, h: Header) -> None:
        """Answer a child learner from the model we compute with (Rudra-adv* broadcast tree)."""
        link = self.link
        b = link.by_index[h.block]
        ts = link.have[b.index]
        answer = pull_answer(
            stopped=b.index in link.stopped, ts=ts, holds=h.timestamp, accepts=pull_oldest(h.aux)
        )
        if answer is None and self.leaving:
            self.reply(h.sender, b, ts, Reply.LEFT)
        elif answer is None:
            self.waiting.append(h)
        elif answer is not Reply.WEIGHTS:
            self.reply(h.sender, b, ts, answer)
        elif not (self.pool.may_pin() or (self.collect() and self.pool.may_pin())):
            self.starved.append(h)  # only this pull waits for a version to be released
        else:
            self.reply(h.sender, b, ts, Reply.WEIGHTS)
            v = self.pool.current
            buf = self.relay.outgoing_version(b.index, v, link.w[b.start : b.stop])
            self.serving.append((self.ch.bulk.Isend(buf, h.sender, b.index), self.pool.pin()))
            self.relayed_bytes += buf.nbytes

    def collect(self) -> bool:
        """Release the versions read by sends to children that completed; True if any did."""
        return release_completed(self.serving, self.pool)

    def reply(self, dest: int, b: Block, ts: int, kind: Reply) -> None:
        out = self.link.out[0]
        Header(Tag.REPLY, b.index, ts, self.side.rank, reply_aux(kind)).pack(out)
        self.ch.down.Send(out, dest, reply_tag(b.index))
        ring(dest)  # the child's pull sleeps on its doorbell (PSExchange.pull)

    def answer(self) -> None:
        """Serve again the pulls that waited for weights newer than ours."""
        waiting, self.waiting = self.waiting, []
        for h in waiting:
            self.serve(h)

    def install(self, fresh: list[Block]) -> None:
        """Install with children reading ``w``: the model that arrived becomes the current
        version and the next one is pulled into a version no send reads (copy-on-write when
        only some blocks arrived), so a child's open send is never waited for."""
        pool, bufs, link = self.pool, self.bufs, self.link
        self.collect()
        if len(fresh) == len(link.blocks) and not link.posted:  # whole model: w_comm becomes w
            pool.publish(self.incoming)
            self.incoming = pool.reserve()  # VersionPool.may_pin leaves one
        else:  # some blocks (others stopped): copy them into a version nobody reads
            write = pool.write()
            self.ensure_versions()
            if write.copy_from is not None:
                self.xp.copyto(bufs[write.target], bufs[write.copy_from])
            link.w = bufs[write.target]
            link.install(fresh)
        self.ensure_versions()
        link.w, link.w_comm = bufs[pool.current], bufs[self.incoming]

    def ensure_versions(self) -> None:
        while len(self.bufs) < self.pool.allocated:
            self.bufs.append(self.xp.empty_like(self.link.w))

    def leave(self) -> None:
        """We stopped at a cut (a signal, a periodic pause) with our last pushes delivered and
        our last pulls answered: answer ``Reply.LEFT`` to every pull for a model newer than
        ours, now and until our children said goodbye (see the module's *Checkpoints*)."""
        self.leaving = True
        self.answer()

    def drained(self) -> bool:
        """Every child said goodbye, every send to one is done, no pull is held."""
        return not self.live and not self.serving and not self.starved

    def pending(self) -> str:
        return (
            f"child learners {sorted(self.live)}, {len(self.serving)} weight sends to them, "
            f"{len(self.starved)} of their pulls held"
        )
