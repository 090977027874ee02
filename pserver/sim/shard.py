"""A simulated parameter-server shard: the real shard's decisions, timed by the event loop.

What a real shard (``pserver.roles.server.ServerShard``, ``shard_pulls.PullAnswers``) does on a
push, a pull, a goodbye and a timeout is done here with the same objects in the same order: the
block's ``ShardBlock`` (its protocol, timestamp, counters, epoch count and learning-rate
schedule; built from the config by ``ShardBlock.build``), the pull-answer rule
``pserver.protocols.pull.pull_answer`` and the injected reply delays of ``InjectPlan``. The
block holds a one-element stand-in for its weights: the simulation computes nothing on them,
but the step's learning rate, the counters and the stop come from the real object.

Messages are served one at a time in arrival order (the shard's loop reads its control
messages in order); each costs ``Costs.service`` seconds (CPU seconds on the shared cores of
``sim.cores``, ``pserver.sim.cores``), after which its decision is taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from pserver.plan.config import Config
from pserver.protocols.bmuf_block import SHARD_BLOCKS
from pserver.protocols.pull import Reply, pull_answer
from pserver.sim.costs import Costs
from pserver.sim.predict import predicting
from pserver.sim.rows import Rows
from pserver.strategies.serving import serving

PUSH, PULL, BYE = 0, 1, 2


class NoStep:
    """The update rule's place in the stand-in block: ``ShardBlock.apply`` computes the step's
    learning rate (the schedule, the protocol's scale) and counts; no weights are stepped."""

    def step(self, w: Any, g: Any, lr: float) -> None:
        del w, g, lr


class SimShard:
    """Shard ``index`` with one parameter block, over ``n_learners`` learners."""

    def __init__(
        self, loop: Any, cfg: Config, costs: Costs, rows: Rows, n_learners: int, train_size: int,
        index: int = 0,
    ) -> None:  # fmt: skip
        self.loop, self.costs, self.rows, self.index = loop, costs, rows, index
        dtype = np.dtype(cfg.model.dtype)
        kind = SHARD_BLOCKS[serving(cfg).block]  # the real shard's choice: BMUF's, or plain
        self.block = kind.build(np.zeros(1, dtype), cfg, n_learners, train_size, np)
        self.block.updater = NoStep()  # the step's rate is computed; the step itself is not
        self.predictions = predicting(self.block, rows, index)  # PP-ASGD's rows, or None
        self.learners: list[Any] = []  # SimLearner by index, set by the engine
        self.queue: deque[tuple[int, int, int, int | None]] = deque()
        self.busy = False
        self.waiting: list[tuple[int, int, int]] = []  # held pulls: (learner, holds, accepts)
        self.requests = [0] * n_learners  # pulls per learner: the delay draws' request index
        self.live = n_learners
        self.timer: float | None = None  # when the protocol's next deadline is checked
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

    def arrive(self, kind: int, learner: int, ts: int, extra: int | None) -> None:
        """A message reaches the shard: ``(PUSH, k, ts, iteration)``, ``(PULL, k, holds,
        accepts)`` or ``(BYE, k, -1, None)``."""
        self.queue.append((kind, learner, ts, extra))
        if not self.busy:
            self.wake()

    def push_and_pull(self, learner: int, ts: int, iteration: int | None, accepts: int) -> None:
        """A learner's push and the pull request it sends right behind it (``PSExchange.push``):
        one event, two messages in order."""
        self.queue.append((PUSH, learner, ts, iteration))
        self.queue.append((PULL, learner, ts, accepts))
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
        t = self.costs.service(self.index, msg[0] == PUSH)
        self.busy_time += t
        if self.cores is not None:
            self.served_since = self.loop.now
            self.cores.run(t, self.served, msg)
        else:
            self.busy_wall += t
            self.loop.after(t, self.served, msg)

    def served(self, msg: tuple[int, int, int, int | None]) -> None:
        if self.cores is not None:
            self.busy_wall += self.loop.now - self.served_since
        self.handlers[msg[0]](msg[1], msg[2], msg[3])
        self.on_time()
        self.busy = False
        if self.queue:
            self.serve_next()
        else:
            self.idle_since = self.loop.now

    # -- pushes (ServerShard.take_gradient, update, after_update) ------------------------------

    def on_push(self, learner: int, sent_ts: int, iteration: int | None) -> None:
        self.take([(learner, sent_ts, iteration)])

    def take(self, entries: list[tuple[int, int, int | None]]) -> None:
        """The gradient(s) of one push: a learner's, or an aggregator's sum of several
        (``pserver.sim.tree``), taken whole or dropped whole."""
        a = self.block
        g = a.inbox()
        self.bytes_in += self.costs.nbytes
        now = self.loop.now
        ts = a.ts
        taken = a.accept(entries, g, now)
        if taken.after_stop:
            self.dropped_after_stop += len(entries)
            return
        update = ts + 1 if taken.accepted else -1
        for (learner, sent_ts, _), d in zip(entries, taken.decisions, strict=True):
            self.grads.append((self.index, learner, sent_ts, d.staleness, update, now))
            if update != -1:
                self.sigmas.append((learner, self.index, sent_ts, d.staleness, now))
        if a.ready(now):
            self.update()
        elif not taken.accepted and a.epochs.counts_drops:
            self.after_update()

    def update(self) -> None:
        a = self.block
        applied = a.apply(a.commit())
        d = applied.decision
        self.updates.append((self.index, d.new_timestamp, self.loop.now, len(d.vector_clock),
                             d.mean_staleness, applied.lr))
        self.rows.clocks.append(d.vector_clock)
        if self.predictions is not None:
            self.predictions.add(applied, a)
        if self.grads.full() or self.updates.full():
            for t in (self.grads, self.sigmas, self.updates):
                self.rows.write(t)  # the clocks go with the updates
        self.after_update()

    def after_update(self) -> None:
        self.block.epoch_ends()  # marks the block done at the last sample
        self.answer_waiting()

    def on_time(self) -> None:
        """``ServerShard.on_time``: a protocol timeout (PSP's τ1) that has passed closes the
        round; a later one gets a timer."""
        a = self.block
        due = a.protocol.deadline()
        if due is None:
            return
        now = self.loop.now
        if a.ready(now):
            self.update()
            return
        if self.timer is None or self.timer > due:
            self.timer = due
            self.loop.after(max(due - now, 0.0), self.fire)

    def fire(self) -> None:
        self.timer = None
        self.on_time()

    # -- pulls (PullAnswers.on_pull, answer) ----------------------------------------------------

    def on_pull(self, learner: int, holds: int, accepts: int | None) -> None:
        request = self.requests[learner]
        self.requests[learner] += 1
        delay = self.costs.plan.pull_delay_for(self.index, learner, request)
        if delay > 0.0:  # PSP-SGD §4.2's rare, large delay of this reply
            self.rows.add("delays", shard=self.index, learner=learner, block=0,
                          request=request, time=self.loop.now, delay=delay)
            self.loop.after(delay, self.answer, learner, holds, accepts)
        else:
            self.answer(learner, holds, accepts)

    def answer(self, learner: int, holds: int, accepts: int | None) -> None:
        a = self.block
        answer = pull_answer(
            stopped=a.done, ts=a.ts, holds=holds, accepts=int(accepts or 0),
            ready=lambda: a.protocol.pull_ready(learner),
        )  # fmt: skip
        if answer is None:
            self.waiting.append((learner, holds, int(accepts or 0)))
            return
        payload = answer is Reply.WEIGHTS
        if payload:
            self.bytes_out += self.costs.nbytes
        trip = self.costs.reply(payload, learner, self.requests[learner])
        self.loop.after(trip, self.learners[learner].on_reply, answer, a.ts)

    def answer_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for pull in waiting:
            self.answer(*pull)

    # -- goodbyes (ServerShard.on_bye, retire) ---------------------------------------------------

    def on_bye(self, learner: int, _ts: int, _extra: int | None) -> None:
        self.live -= 1
        a = self.block
        a.protocol.retire(learner)
        if not a.done and a.in_round and (a.ready(self.loop.now) or not self.live):
            self.update()
        self.answer_waiting()

    def end_rows(self, size: int) -> None:
        """The ``servers`` and ``blocks`` rows (``ShardRows.end``)."""
        a, now = self.block, self.loop.now
        self.rows.add("servers", shard=self.index, updates=a.ts,
                      dropped_after_stop=self.dropped_after_stop,
                      wait_time=max(now - self.busy_wall, 0.0), bytes_in=self.bytes_in,
                      bytes_out=self.bytes_out, skipped_snapshots=0, cpu_time=self.busy_time,
                      run_time=now)
        self.rows.add("blocks", block=0, shard=self.index, timestamp=a.ts, applied=a.applied,
                      dropped=a.dropped, size=size)
