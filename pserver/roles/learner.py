"""The learner driver, and its blocking parameter-server exchange (Rudra §III-B).

A learner is a :class:`~pserver.roles.trainer.Trainer` (the loop) with an exchange: this
module's :class:`PSExchange` (``comm.mode = blocking``: inquire, pull when newer, push) or
:class:`~pserver.roles.overlap.OverlapExchange` (``thread`` | ``nonblocking``).

Weights arrive in a communication buffer whose receives stay posted between iterations; a pull
that brings every block installs the model by swapping that buffer with the compute buffer
(no copy). The minibatches come from an I/O thread that prefetches from the data server.

Partial pulling (PSP-SGD Algorithm 1, worker lines 7-15): the learner may start computing once
``protocol.pull_fraction`` of the blocks it asked for are in (plus ``protocol.tau2``), keeping
its previous copy of the others. A reply that misses the iteration stays outstanding and is
picked up by a later one; no request is sent twice. A reply too old for the iteration still
replaces an older copy (``PartialPull.judge``). The timestamps of pulls and pushes follow
``protocol.pull_timestamp`` (``PullRule``): with partial pulling under hardsync or PSP every push
of an iteration carries the learner's iteration tag (PSP-SGD Algorithm 1, worker line 17), so
that a gradient computed on a kept copy still answers the block's round; the liveness proof is
in ``pserver/protocols/rounds.py``.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from pserver.ckpt.files import State
from pserver.ckpt.records.partial_pull import keeps_copies, learner_state, restore_learner
from pserver.comm.wire import Reply, WireError, split_reply
from pserver.plan.config import Config, pull_timestamp
from pserver.plan.topology import Block
from pserver.protocols.partial_pull import ITERATION, REFRESH, USE, PartialPull, PullRule
from pserver.roles.exchange import Exchange, LearnerSide
from pserver.roles.pslink import PSLink
from pserver.strategies import lookup


def waits_for_update(cfg: Config) -> bool:
    """Whether the protocol makes learners wait for a newer model before every minibatch."""
    return lookup(cfg.protocol.name).waits_for_update


#: a block's payload up to this many bytes is delivered before a pull sleeps on its doorbell
#: (``PSExchange.pull``); a larger one, read by the receiver in one copy, completes while the
#: learner sleeps (delivering several large blocks first slowed the server: docs/performance.md)
SMALL_PUSH = 256 * 1024


class PSExchange(Exchange):
    """Blocking PS client: pull (when newer) before a minibatch, push after it."""

    freeze_after_weights = False  # inject.freeze_*: right after the push and its pull requests
    relayed_bytes = 0  # a blocking learner forwards nothing

    def __init__(self, side: LearnerSide, weights: Any) -> None:
        self.side, self.cfg, self.xp = side, side.cfg, side.xp
        self.link = link = PSLink(side, weights)
        self.blocks, self.by_index = link.blocks, link.by_index
        self.have, self.stopped, self.asked = link.have, link.stopped, link.asked  # shared
        self.waiter = side.waiter()
        self.grad = self.xp.empty_like(link.w)
        self.shm_setup(side)
        p = self.cfg.protocol
        self.partial = PartialPull(len(self.blocks), p.pull_fraction, p.tau2)
        itemsize = link.w.dtype.itemsize
        self.small_pushes = max(b.size for b in self.blocks) * itemsize <= SMALL_PUSH
        self.rule = PullRule(pull_timestamp(self.cfg), waits_for_update(self.cfg))
        self.steps = 0
        # ``interrupt`` (Exchange, set by the trainer): a stop asked while waiting in a pull;
        # under the iteration rule the learner leaves the pull, and says goodbye before
        # collecting its held pulls (pserver.ckpt.records.partial_pull: the cut's liveness)
        self.leaving = False

    def shm_setup(self, side: LearnerSide) -> None:
        """``comm.transport = "shm"``: blocks whose shard shares our node go through its window."""
        lay = side.layout
        self.ack = self.xp.empty(0, dtype=self.xp.int8)
        self.shared = {
            b.index: lay.servers[b.shard]
            for b in self.blocks
            if side.shm is not None and side.shm.shares(lay.servers[b.shard], side.rank)
        }
        # one shard owns the whole model: compute the gradient straight into our slot
        self.grad_in_slot = len(self.shared) == len(self.blocks) and len(lay.servers) == 1
        if self.grad_in_slot:
            self.grad = side.shm.slot(lay.servers[0], side.rank)
        # one shard, one block: compute on the window version the reply names, without a copy
        self.zero_copy = bool(self.shared) and side.shm.zero_copy(lay.servers[0])
        self.window_w: Any = None

    # -- the exchange --------------------------------------------------------------------------

    def weights(self) -> Any | None:
        if self.steps > 0 and not self.pull():  # the first minibatch runs on w0
            return None
        return self.link.w

    def gradient_buffer(self) -> Any:
        return self.grad

    def gradient(self, g: Any) -> None:
        self.push(g)
        self.steps += 1

    def staleness(self) -> tuple[float, int]:
        return self.partial.stale_fraction, self.partial.dropped

    def done(self) -> float:
        return 0.0  # finish() delivers the last pushes

    def close(self) -> None:
        pass

    def state(self) -> State:
        """Nothing the shards do not hold: the model is pulled again on resume. With partial
        pulling or the iteration rule: the copies, their timestamps and the iteration tag
        (``pserver.ckpt.records.partial_pull``)."""
        if keeps_copies(self.cfg):
            w = self.side.backend.to_host(self.link.w)
            return learner_state(w, self.have, self.rule.tag, self.steps)
        return State({}, {"steps": self.steps})

    def restore(self, state: State) -> None:
        """Resume: the first minibatch waits for the shards' checkpointed model (with partial
        pulling: for ``ceil(b · blocks)`` blocks newer than the saved tag, on the saved copies)."""
        if keeps_copies(self.cfg) and "tag" in state.attrs:
            w, have, self.rule.tag, steps = restore_learner(state)
            self.side.backend.copy_from_host(w, self.link.w)
            self.have.update(have)
            self.steps = max(1, steps)  # > 0: weights() pulls first
            return
        self.steps = max(1, int(state.attrs.get("steps", 0)))  # > 0: weights() pulls first
        for index in self.have:
            self.have[index] = -1  # older than any model: every block answers with weights

    # -- pull ----------------------------------------------------------------------------------

    def pull(self) -> bool:
        """Ask each live block for weights newer than ours; False once every block has stopped."""
        live = self.link.live()
        # hardsync and PSP: newer than our copy (block rule) or than our last iteration's tag
        wanted = {b.index: self.oldest(b) for b in live}
        self.partial.start(self.side.now(), wanted)
        for b in live:
            if b.index not in self.asked:
                self.ask(b)
        fresh: list[Block] = []
        left = False

        def done() -> bool:
            nonlocal left
            for b in self.link.answered():
                self.on_reply(b, fresh)
            if not self.asked or self.partial.ready(self.side.now()):
                return True
            left = self.rule.rule == ITERATION and self.interrupt()
            return left

        # every reply is followed by a ring of our doorbell (PullAnswers, the aggregator's and
        # a relaying learner's reply); PSP's τ2 deadline is no ring, so a partial pull keeps
        # the back-off's fine sleeps. A send may move only while its sender calls MPI, so the
        # wait sleeps on the doorbell only once our pushes are delivered
        rung_by = self.link.upstream() if self.partial.fraction >= 1.0 else ()
        if rung_by and self.small_pushes:
            # a small payload goes through MPI's shared-memory cells, which the sender fills
            # as it tests: delivered first, the pull sleeps at once (quicker than the check
            # below alone: docs/performance.md, *Issue 26, third pass*)
            self.waiter.waitall(self.link.pushing, "gradient pushes to be delivered")
        self.waiter.until(done, lambda: f"weights of blocks {sorted(self.asked)}",
                          rung_by=rung_by, quiet=self.pushes_delivered)  # fmt: skip
        # the next compute overwrites ``grad``; the server took the pushes before our pulls
        self.waiter.waitall(self.link.pushing, "gradient pushes to be delivered")
        self.link.pushing.clear()
        self.install(fresh)
        if left:  # a stop at this step boundary: the tag stays that of the last push
            return False
        self.rule.pulled({i: ts for i, ts in self.have.items() if i not in self.stopped})
        return not self.link.all_stopped()

    def pushes_delivered(self) -> bool:
        return MPI.Request.Testall(self.link.pushing)

    def oldest(self, b: Block) -> int:
        return self.rule.oldest(self.have[b.index])

    def ask(self, b: Block) -> None:
        if self.leaving:  # said goodbye at a cut: collect answers, ask nothing more
            return
        self.link.ask(b, self.oldest(b), payload=b.index not in self.shared)

    def on_reply(self, b: Block, fresh: list[Block]) -> None:
        h = self.link.reply(b)
        now = self.side.now()
        kind, version = split_reply(h.aux)
        if kind == Reply.STOP:
            self.stopped.add(b.index)
            self.partial.forget(b.index, now)  # done: never wait for it again
        elif kind == Reply.CURRENT:
            # our copy is fresh enough, unless the iteration rule's requirement rose meanwhile
            if not self.partial.on_block(b.index, h.timestamp, now):
                self.ask(b)
        elif kind == Reply.WEIGHTS:
            self.take_weights(b, version)
            verdict = self.partial.judge(b.index, h.timestamp, self.have[b.index], now)
            if verdict == USE:
                self.have[b.index] = h.timestamp
                fresh.append(b)
            elif b.index not in self.stopped:  # older than this iteration needs: ask again
                if verdict == REFRESH:
                    self.have[b.index] = h.timestamp
                    self.install([b])  # now: the request below reposts a receive into w_comm
                self.ask(b)
        else:
            raise WireError(f"unknown reply {h}")

    def take_weights(self, b: Block, version: int) -> None:
        """Bring block ``b`` of a WEIGHTS reply where :meth:`install` expects it."""
        if self.zero_copy:  # ours to compute on until our next push
            self.side.shm.sync()
            self.window_w = self.side.shm.weights(self.shared[b.index], b, version)
        elif b.index in self.shared:
            self.copy_shared(b, version)
        else:
            self.waiter.wait(self.link.payload_request(b), f"weights payload of block {b.index}")
            self.link.arrived(b)

    def copy_shared(self, b: Block, version: int) -> None:
        """Copy block ``b`` (the version the reply names) out of its shard's window, then
        acknowledge: the shard may reuse that version once every copy of it is acknowledged."""
        shm, server = self.side.shm, self.shared[b.index]
        shm.sync()
        self.xp.copyto(self.link.w_comm[b.start : b.stop], shm.weights(server, b, version))
        self.side.channels.ack.Send(self.ack, server, b.index)

    def install(self, fresh: list[Block]) -> None:
        if not self.zero_copy:
            self.link.install(fresh)
        elif fresh:
            self.link.w = self.window_w

    # -- push ----------------------------------------------------------------------------------

    def push(self, grad: Any) -> None:
        """Send every live block's gradient with the timestamp it was computed from.

        Each push is followed at once by the next pull request of that block: the server reads
        its control messages in order, so the pull is answered only after the gradient has been
        taken (Rudra-base semantics unchanged), while block k's weights can travel back as
        block k+1's gradient arrives. Where the block's shard is our direct parent, under the
        block rule, the push and that pull share one header (``Tag.PUSH_PULL``), which the
        shard handles as the two in that order. The sends are waited for before ``grad`` is
        reused.
        """
        link = self.link
        for b in link.live():
            shared = b.index in self.shared  # the shard reads the gradient in its window
            if shared:
                if not self.grad_in_slot:  # several shards: the slots are apart
                    slot = self.side.shm.slot(self.shared[b.index], self.side.rank, b)
                    self.xp.copyto(slot, grad[b.start : b.stop])
                self.side.shm.sync()  # the gradient is visible before the header announces it
            iteration = self.rule.push_iteration()
            asks = b.index not in self.asked and link.source[b.index] == link.owner[b.index]
            if asks and iteration is None and not self.leaving and link.joins_pull(b):
                # the push and its pull in one header (Tag.PUSH_PULL): the same order at the
                # shard, half the headers
                link.push(b, grad, payload=not shared, oldest=self.oldest(b))
                continue
            link.push(b, grad, iteration, payload=not shared)
            if asks:
                self.ask(b)

    # -- end -----------------------------------------------------------------------------------

    def finish(self) -> None:
        """Collect late replies, cancel the idle receives, and say goodbye upstream."""
        late: list[Block] = []
        self.waiter.waitall(self.link.pushing, "the last gradient pushes to be delivered")
        if self.asked and self.rule.rule == ITERATION:  # a cut (pserver.ckpt.records.partial_pull)
            self.leave(late)
            return
        self.collect(late, "the late reply of block {}")
        self.link.goodbye()

    def collect(self, late: list[Block], what: str) -> None:
        """Wait for the answer to every pull still asked (``what`` names one by its block)."""
        while self.asked:
            index, req = next(iter(self.asked.items()))
            self.waiter.wait(req, what.format(index))
            del self.asked[index]
            self.on_reply(self.by_index[index], late)

    def leave(self, late: list[Block]) -> None:
        """The cut under the iteration rule: goodbye first, so that every shard answers our
        held pulls STOP (``PullAnswers.release_departed``), then collect every answer, asking
        nothing again, and keep the weights that came (``pserver.ckpt.records.partial_pull``, point
        2)."""
        self.leaving = True
        self.link.say_bye()
        self.collect(late, "the last reply of block {} (after our goodbye)")
        self.install(late)
        self.link.cancel_posted()
