"""A simulated parameter-server shard: the real shard's decisions, timed by the event loop.

What a real shard (``pserver.roles.server.ServerShard``, ``shard_pulls.PullAnswers``,
``shard_rows.ShardRows``) does on a push, a pull, a goodbye and a timeout is done here with the
same objects in the same order, for each of the blocks it owns (``pserver.plan.topology
.split_blocks``: shard s owns a contiguous run of them): each block's ``ShardBlock`` (its
protocol, timestamp, counters, epoch count and learning-rate schedule; built from the config by
``ShardBlock.build``), the pull-answer rule ``pserver.protocols.pull.pull_answer`` and the
injected reply delays of ``InjectPlan`` (drawn per shard, learner and request, as
``ShardInjection`` counts them). A block holds a one-element stand-in for its weights: the
simulation computes nothing on them, but the step's learning rate, the counters and the stop come
from the real object. As in ``ShardRows``, the ``gradients``, ``staleness`` and ``updates`` rows
come from the shard's first block alone, and so do PP-ASGD's ``predictions`` rows
(``pserver.sim.predict``: every block predicts with its own ``Predictor``). A push is taken by
:meth:`SimShard.take` as ``ServerShard.take_gradient`` takes it: one learner's gradient, or an
aggregator's sum with its (learner, timestamp) pairs (``pserver.sim.tree.TreeShard``, over one
shard with one block).

Messages are served one at a time in arrival order (the shard's loop reads its control
messages in order); each costs ``Costs.service`` seconds for its block's bytes (CPU seconds on
the shared cores of ``sim.cores``, ``pserver.sim.cores``), after which its decision is taken;
then, as after every message of the real loop, every block's protocol deadline is checked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pserver.plan.config import Config
from pserver.plan.topology import Block
from pserver.protocols.bmuf_block import SHARD_BLOCKS
from pserver.protocols.pull import Reply, pull_answer
from pserver.sim.costs import Costs
from pserver.sim.predict import predicting
from pserver.sim.rows import Rows
from pserver.strategies.serving import serving

PUSH, PULL, BYE = 0, 1, 2
Message = tuple[int, int, int, int, "int | None"]  # (kind, learner, block, ts, extra)


class NoStep:
    """The update rule's place in the stand-in block: ``ShardBlock.apply`` computes the step's
    learning rate (the schedule, the protocol's scale) and counts; no weights are stepped."""

    def step(self, w: Any, g: Any, lr: float) -> None:
        del w, g, lr


class SimBlock:
    """One block of a shard (``BlockState``'s part that decides): its ``ShardBlock`` and its
    held pulls, ``(learner, holds, accepts)``."""

    __slots__ = ("index", "size", "nbytes", "arith", "waiting")

    def __init__(self, b: Block, cfg: Config, n_learners: int, train_size: int) -> None:
        dtype = np.dtype(cfg.model.dtype)
        self.index, self.size, self.nbytes = b.index, b.size, b.size * dtype.itemsize
        kind = SHARD_BLOCKS[serving(cfg).block]  # the real shard's choice: BMUF's, or plain
        self.arith = kind.build(np.zeros(1, dtype), cfg, n_learners, train_size, np)
        self.arith.updater = NoStep()  # the step's rate is computed; the step itself is not
        self.waiting: list[tuple[int, int, int]] = []


class SimShard:
    """Shard ``index`` owning ``blocks`` (every block of the model when None: one shard), over
    ``n_learners`` learners."""

    def __init__(
        self, loop: Any, cfg: Config, costs: Costs, rows: Rows, n_learners: int, train_size: int,
        index: int = 0, blocks: Sequence[Block] | None = None,
    ) -> None:  # fmt: skip
        self.loop, self.costs, self.rows, self.index = loop, costs, rows, index
        if blocks is None:  # the whole model, one block
            size = max(costs.nbytes // np.dtype(cfg.model.dtype).itemsize, 1)
            blocks = [Block(0, 0, size, index)]
        self.blocks = {b.index: SimBlock(b, cfg, n_learners, train_size) for b in blocks}
        self.first = min(self.blocks)  # ShardRows: the rows are the first block's
        self.block = self.blocks[self.first].arith  # its ShardBlock
        # PP-ASGD: every block predicts with its own Predictor; the predictions rows are the
        # first block's (ShardRows.prediction); None where the registry says no
        writers = {i: predicting(st.arith, rows, index) for i, st in self.blocks.items()}
        self.predictions = writers[self.first]
        self.learners: list[Any] = []  # SimLearner by index, set by the engine
        self.queue: deque[Message] = deque()
        self.busy = False
        self.requests = [0] * n_learners  # pulls per learner: the delay draws' request index
        self.live = n_learners
        self.timer: float | None = None  # when the protocols' next deadline is checked
        self.dropped_after_stop = 0
        self.bytes_in = self.bytes_out = 0
        self.busy_time = 0.0  # CPU s of its messages
        self.busy_wall = 0.0  # wall s serving them (more than busy_time on shared cores)
        self.served_since = 0.0
        self.cores: Any = None  # sim.cores: the node's processors (pserver.sim.cores), or None
        self.idle_since = 0.0  # when its queue last ran empty (sim.polls: its wait began)
        self.grads = rows.table("gradients", "shard", "learner", "timestamp", "staleness",
                                "update", "time")
        self.sigmas = rows.staleness()
        self.updates = rows.table("updates", "shard", "timestamp", "time", "n_gradients",
                                  "mean_staleness", "lr")
        self.handlers: dict[int, Callable[..., None]] = {
            PUSH: self.on_push, PULL: self.on_pull, BYE: self.on_bye,
        }  # fmt: skip

    # -- the queue ---------------------------------------------------------------------------

    def arrive(self, kind: int, learner: int, block: int, ts: int, extra: int | None) -> None:
        """A message reaches the shard: ``(PUSH, k, b, ts, iteration)``, ``(PULL, k, b, holds,
        accepts)`` or ``(BYE, k, -1, -1, None)`` (and a tree's ``SUM`` and ``RETIRE``,
        ``pserver.sim.tree``)."""
        self.queue.append((kind, learner, block, ts, extra))
        if not self.busy:
            self.wake()

    def push_and_pull(self, learner: int, block: int, ts: int, iteration: int | None,
                      accepts: int | None) -> None:  # fmt: skip
        """A learner's push of ``block`` and, unless ``accepts`` is None (a pull of it is still
        out), the pull request it sends right behind it (``PSExchange.push``): one event, the
        messages in order."""
        self.queue.append((PUSH, learner, block, ts, iteration))
        if accepts is not None:
            self.queue.append((PULL, learner, block, ts, accepts))
        if not self.busy:
            self.wake()

    def wake(self) -> None:
        """A message reached the idle shard: served now, or with ``sim.polls`` at the next test
        of its wait (the messages that come meanwhile queue behind it)."""
        if self.costs.poll is not None:
            waited = self.loop.now - self.idle_since
            late = self.costs.seen(waited) - waited
            if late > 0.0:
                self.busy = True
                self.loop.after(late, self.serve_next)
                return
        self.serve_next()

    def serve_next(self) -> None:
        msg = self.queue.popleft()
        self.busy = True
        nbytes = self.blocks[msg[2]].nbytes if msg[0] == PUSH else 0
        t = self.costs.service(self.index, msg[0] == PUSH, nbytes)
        self.busy_time += t
        if self.cores is not None:
            self.served_since = self.loop.now
            self.cores.run(t, self.served, msg)
        else:
            self.busy_wall += t
            self.loop.after(t, self.served, msg)

    def served(self, msg: Message) -> None:
        if self.cores is not None:
            self.busy_wall += self.loop.now - self.served_since
        self.handlers[msg[0]](msg[1], msg[2], msg[3], msg[4])
        self.on_time()
        self.busy = False
        if self.queue:
            self.serve_next()
        else:
            self.idle_since = self.loop.now

    # -- pushes (ServerShard.take_gradient, update, after_update) ------------------------------

    def on_push(self, learner: int, block: int, sent_ts: int, iteration: int | None) -> None:
        self.take(block, [(learner, sent_ts, iteration)])

    def take(self, block: int, entries: list[tuple[int, int, int | None]]) -> None:
        """The gradient(s) of one push of ``block``: a learner's, or an aggregator's sum of
        several (``pserver.sim.tree``), taken whole or dropped whole."""
        st = self.blocks[block]
        a = st.arith
        g = a.inbox()
        self.bytes_in += st.nbytes
        now = self.loop.now
        ts = a.ts
        taken = a.accept(entries, g, now)
        if taken.after_stop:
            self.dropped_after_stop += len(entries)
            return
        update = ts + 1 if taken.accepted else -1
        if block == self.first:  # ShardRows.gradient: one row per (learner, ts) pair
            for (learner, sent_ts, _), d in zip(entries, taken.decisions, strict=True):
                self.grads.append((self.index, learner, sent_ts, d.staleness, update, now))
                if update != -1:
                    self.sigmas.append((learner, self.index, sent_ts, d.staleness, now))
        if a.ready(now):
            self.update(st)
        elif not taken.accepted and a.epochs.counts_drops:
            self.after_update(st)

    def update(self, st: SimBlock) -> None:
        a = st.arith
        applied = a.apply(a.commit())
        if st.index == self.first:  # ShardRows.update, ShardRows.prediction
            d = applied.decision
            self.updates.append((self.index, d.new_timestamp, self.loop.now,
                                 len(d.vector_clock), d.mean_staleness, applied.lr))
            self.rows.clocks.append(d.vector_clock)
            if self.predictions is not None:
                self.predictions.add(applied, a)
            if self.grads.full() or self.updates.full():
                for t in (self.grads, self.sigmas, self.updates):
                    self.rows.write(t)  # the clocks go with the updates
        self.after_update(st)

    def after_update(self, st: SimBlock) -> None:
        st.arith.epoch_ends()  # marks the block done at the last sample
        self.answer_waiting(st)

    def on_time(self) -> None:
        """``ServerShard.on_time``: a protocol timeout (PSP's τ1) that has passed closes its
        block's round; the earliest later one gets a timer."""
        now = self.loop.now
        due: float | None = None
        for st in self.blocks.values():
            d = st.arith.protocol.deadline()
            if d is None:
                continue
            if st.arith.ready(now):
                self.update(st)
                d = st.arith.protocol.deadline()  # the next round's, if it has one yet
                if d is None:
                    continue
            due = d if due is None else min(due, d)
        if due is not None and (self.timer is None or self.timer > due):
            self.timer = due
            self.loop.after(max(due - now, 0.0), self.fire)

    def fire(self) -> None:
        self.timer = None
        self.on_time()

    # -- pulls (PullAnswers.on_pull, answer) ----------------------------------------------------

    def on_pull(self, learner: int, block: int, holds: int, accepts: int | None) -> None:
        request = self.requests[learner]
        self.requests[learner] += 1
        delay = self.costs.plan.pull_delay_for(self.index, learner, request)
        if delay > 0.0:  # PSP-SGD §4.2's rare, large delay of this reply
            self.rows.add("delays", shard=self.index, learner=learner, block=block,
                          request=request, time=self.loop.now, delay=delay)
            self.loop.after(delay, self.answer, self.blocks[block], learner, holds, accepts)
        else:
            self.answer(self.blocks[block], learner, holds, accepts)

    def answer(self, st: SimBlock, learner: int, holds: int, accepts: int | None) -> None:
        a = st.arith
        answer = pull_answer(
            stopped=a.done, ts=a.ts, holds=holds, accepts=int(accepts or 0),
            ready=lambda: a.protocol.pull_ready(learner),
        )  # fmt: skip
        if answer is None:
            st.waiting.append((learner, holds, int(accepts or 0)))
            return
        payload = answer is Reply.WEIGHTS
        if payload:
            self.bytes_out += st.nbytes
        trip = self.costs.reply(payload, learner, self.requests[learner], st.nbytes)
        self.loop.after(trip, self.learners[learner].on_reply, st.index, answer, a.ts)

    def answer_waiting(self, st: SimBlock) -> None:
        waiting, st.waiting = st.waiting, []
        for pull in waiting:
            self.answer(st, *pull)

    # -- goodbyes (ServerShard.on_bye, retire) ---------------------------------------------------

    def on_bye(self, learner: int, _block: int, _ts: int, _extra: int | None) -> None:
        """A learner's goodbye. It holds no pull here (a simulated learner stops once every
        block answered STOP, with no request out), so ``release_departed`` has nothing to do."""
        self.live -= 1
        now = self.loop.now
        for st in self.blocks.values():
            a = st.arith
            a.protocol.retire(learner)
            if not a.done and a.in_round and (a.ready(now) or not self.live):
                self.update(st)
            self.answer_waiting(st)

    @property
    def updated(self) -> int:
        """The ``servers`` row's ``updates``: the highest timestamp of its blocks."""
        return max(st.arith.ts for st in self.blocks.values())

    def end_rows(self) -> None:
        """The ``servers`` and ``blocks`` rows (``ShardRows.end``)."""
        now = self.loop.now
        self.rows.add("servers", shard=self.index, updates=self.updated,
                      dropped_after_stop=self.dropped_after_stop,
                      wait_time=max(now - self.busy_wall, 0.0), bytes_in=self.bytes_in,
                      bytes_out=self.bytes_out, skipped_snapshots=0, cpu_time=self.busy_time,
                      run_time=now)
        for st in self.blocks.values():
            a = st.arith
            self.rows.add("blocks", block=st.index, shard=self.index, timestamp=a.ts,
                          applied=a.applied, dropped=a.dropped, size=st.size)
