"""ADPSGD simulated (IBM paper §3, Fig. 3b, Fig. 4; the real exchange: ``pserver.roles.gossip``).

The schedule and the books are the real run's objects: ``pserver.protocols.ring.Ring`` (who
sends, to which neighbour after which update), ``GossipLedger`` (each learner's vector clock,
the version of its model, the σ of each gradient and the age of each neighbour model averaged
in) and ``Goodbyes`` (when a receiver may leave); the data server's stop is
``pserver.protocols.lockstep.DataQuota``'s free quota (``pserver.sim.feed``). What is simulated
is when things happen, in ``Trainer.step``'s order:

* a learner's step: its model is snapshotted (``GossipLedger.snapshot``: ``Gossip.snapshot``),
  it takes a minibatch from its prefetcher (the stop ends its training), computes
  (``Costs.compute``), releases the slot, then updates (``Gossip.update``): a **sender** first
  waits for its previous exchange to complete, then the gradient's σ is recorded, the step
  ticks and a sender sends its model to the schedule's neighbour;
* a **receiver** serves the requests one at a time in arrival order (its communication
  thread answers while it computes): a request's model arrives ``sim.latency`` + bytes /
  ``sim.bandwidth`` after it was sent; serving it costs ``sim.message_time`` +
  ``sim.update_per_byte`` × bytes (the average), at whose start the receiver's answer (its
  clock before the average) is taken and the sender's model is mixed into its book; the answer
  travels back as the request came, and the receiver takes the next request once it is
  delivered (``Gossip.serve``);
* the sender mixes the answer into its book when it arrives, and its exchange is complete;
* the end (``Gossip.finish``): a sender that got the stop waits for its last exchange, then
  says goodbye to each neighbour (a header, ``sim.latency``); a receiver leaves once it has
  the stop and every neighbour's goodbye and serves nothing; the final average model is an
  allreduce of all learners (``pserver.sim.collective.allreduce_time``) after the last has left.
  The epoch averages in between are non-blocking and never waited on in training: not timed.

The dump has the real ADPSGD dump's rows: ``train`` (``push_time``: a sender's wait for its
previous exchange), ``exchanges`` (one per average on each side, with the partner's step and
age), ``staleness`` (one per applied gradient: σ = the averages mixed in since its snapshot)
and ``learners``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pserver.plan.config import Config
from pserver.protocols.lockstep import FREE, DataQuota, total_minibatches
from pserver.protocols.ring import SENDER, Goodbyes, GossipLedger, Ring
from pserver.sim.collective import allreduce_time
from pserver.sim.costs import Costs
from pserver.sim.feed import Feed
from pserver.sim.learner import NAN, DataServer
from pserver.sim.rows import Rows

Header = tuple[int, list[int]]  # (the sender's step, its vector clock) as sent


class GossipLearner:
    """One ADPSGD learner: its book, its step loop and (a receiver) its request queue."""

    __slots__ = (
        "index", "run", "book", "sender", "pending", "waiting", "queue", "serving", "goodbyes",
        "steps", "stopped", "left", "fetch", "compute_now", "compute_time", "wait_time",
        "push_time", "done_at", "finished_at",
    )  # fmt: skip

    def __init__(self, index: int, run: GossipRun) -> None:
        self.index, self.run = index, run
        self.book = GossipLedger(run.ring, index)
        self.sender = self.book.role == SENDER
        self.pending: tuple[int, float] | None = None  # a sender's exchange: partner, start
        self.waiting = False  # a sender's update waits for that exchange
        self.queue: deque[tuple[int, Header, float]] = deque()  # a receiver's requests
        self.serving = False
        self.goodbyes = None if self.sender else Goodbyes(run.ring, index)
        self.steps = 0
        self.stopped = False  # the data server's stop was taken
        self.left = False
        self.fetch = self.compute_now = 0.0
        self.compute_time = self.wait_time = self.push_time = 0.0
        self.done_at = 0.0
        self.finished_at = 0.0

    # -- the step (Trainer.step with GossipExchange) ---------------------------------------------

    def step(self) -> None:
        run, now = self.run, self.run.loop.now
        self.book.snapshot()  # GossipExchange.weights -> Gossip.snapshot
        ready, ok = run.feed.take(self.index)
        if not ok:
            self.stopped = True
            self.finish()
            return
        begin = max(now, ready)
        self.fetch = begin - now
        self.compute_now = run.costs.compute(self.index, self.steps)
        run.loop.after(self.fetch + self.compute_now, self.computed)

    def computed(self) -> None:
        run = self.run
        self.done_at = run.loop.now
        run.feed.release(self.index, self.done_at)
        if self.pending is not None:  # Gossip.update: the previous exchange completes first
            self.waiting = True
            return
        self.update()

    def update(self) -> None:
        run, now = self.run, self.run.loop.now
        waited = now - self.done_at
        version, sigma = self.book.gradient()
        run.sigmas.append((self.index, self.index, version, sigma, now))
        if run.sigmas.full():
            run.rows.write(run.sigmas)
        partner = self.book.stepped()
        if partner is not None:
            self.pending = (partner, now)
            hdr = (self.book.clock.own, list(self.book.clock.steps))
            run.loop.after(run.message, run.learners[partner].request, self.index, hdr, now)
        c = self.compute_now
        self.compute_time += c
        self.wait_time += self.fetch + waited
        self.push_time += waited
        run.train.append((self.index, self.steps, now, NAN, NAN, c, self.fetch + waited, 0.0,
                          waited, 0.0, 0))  # fmt: skip
        if run.train.full():
            run.rows.write(run.train)
        freeze = 0.0
        if self.index == run.costs.plan.freeze_learner:  # inject.freeze_*: after the exchange
            freeze = run.costs.plan.freeze_for(self.index, self.steps)
        self.steps += 1
        run.loop.after(freeze + run.costs.sim.step_overhead, self.step)

    # -- a sender's exchange (Gossip.start, sender_progress) ------------------------------------

    def answered(self, partner: int, hdr: Header) -> None:
        """The partner's answer (its model before the average) is in: mix it, complete."""
        now = self.run.loop.now
        assert self.pending is not None
        started = self.pending[1]
        self.mix(partner, hdr, now - started)
        self.pending = None
        if self.waiting:
            self.waiting = False
            self.update()
        elif self.stopped:
            self.bye()

    # -- a receiver's service (Gossip.receiver_progress, serve) ---------------------------------

    def request(self, sender: int, hdr: Header, started: float) -> None:
        assert self.goodbyes is not None
        self.goodbyes.request(sender)  # a stranger's or one after its goodbye: GossipError
        self.queue.append((sender, hdr, started))
        if not self.serving:
            self.serve_next()

    def serve_next(self) -> None:
        run = self.run
        sender, hdr, _sent = self.queue.popleft()
        self.serving = True
        answer = (self.book.clock.own, list(self.book.clock.steps))  # before the average
        # the real receiver times its row from finding the request to the model's arrival:
        # both come together here (the queue wait before it was free is not in the row)
        self.mix(sender, hdr, 0.0)
        run.loop.after(run.service, self.answer, sender, answer)

    def answer(self, sender: int, answer: Header) -> None:
        run = self.run
        run.loop.after(run.message, run.learners[sender].answered, self.index, answer)
        run.loop.after(run.message, self.delivered)

    def delivered(self) -> None:
        self.serving = False
        if self.queue:
            self.serve_next()
        else:
            self.maybe_leave()

    def on_bye(self, sender: int) -> None:
        assert self.goodbyes is not None
        self.goodbyes.bye(sender)
        self.maybe_leave()

    def mix(self, partner: int, hdr: Header, waited: float) -> None:
        """``Gossip.mixed``: the ``exchanges`` row and the book (clock, version)."""
        run = self.run
        partner_step = hdr[0]
        step, age = self.book.mixed(partner_step, hdr[1])
        run.exchanges.append((self.index, step, partner, age, partner_step, run.nbytes, waited,
                              run.loop.now))  # fmt: skip
        if run.exchanges.full():
            run.rows.write(run.exchanges)

    # -- the end (Gossip.finish) -----------------------------------------------------------------

    def finish(self) -> None:
        if self.sender:
            if self.pending is None:
                self.bye()
            return  # answered() says goodbye once the last exchange completes
        self.maybe_leave()

    def bye(self) -> None:
        run = self.run
        for j in run.ring.neighbours(self.index):
            run.loop.after(run.latency, run.learners[j].on_bye, self.index)
        self.leave()

    def maybe_leave(self) -> None:
        assert self.goodbyes is not None
        if self.stopped and not self.left and self.goodbyes.done and not self.serving:
            self.leave()

    def leave(self) -> None:
        self.left = True
        self.finished_at = self.run.loop.now
        self.run.left()


class GossipRun:
    """λ ADPSGD learners and their data server on ``loop``; ``start()`` then ``loop.run()``."""

    def __init__(self, loop: Any, cfg: Config, costs: Costs, rows: Rows, n: int,
                 train_size: int) -> None:  # fmt: skip
        self.loop, self.costs, self.rows, self.n = loop, costs, rows, n
        self.ring = Ring(n)
        total = total_minibatches(cfg, train_size)
        self.feed = Feed(DataQuota(FREE, total, n), DataServer(cfg.sim.data_time),
                         cfg.data.prefetch, n)  # fmt: skip
        s = costs.sim
        self.nbytes = costs.nbytes
        self.latency = s.latency
        self.message = costs.message(True)  # a header and the model
        self.service = s.message_time + s.update_per_byte * costs.nbytes  # the average
        self.final = allreduce_time(costs, n, cfg.comm.bucket_mib)  # the final average model
        self.train = rows.train()
        self.exchanges = rows.exchanges()
        self.sigmas = rows.staleness()
        self.learners = [GossipLearner(k, self) for k in range(n)]
        self.live = n
        self.end = 0.0

    @property
    def updates(self) -> int:
        return sum(lr.steps for lr in self.learners)

    def start(self) -> None:
        now = self.loop.now
        for k in range(self.n):
            self.feed.open(k, now)
        for lr in self.learners:
            lr.step()

    def left(self) -> None:
        self.live -= 1
        if not self.live:  # GossipModel.finish: the final average, once every learner is done
            self.loop.after(self.final, self.averaged)

    def averaged(self) -> None:
        self.end = self.loop.now

    def end_rows(self, end: float) -> None:
        """The ``learners`` rows (``Trainer``'s totals)."""
        b = self.costs.batch
        for lr in self.learners:
            busy = lr.compute_time + lr.wait_time
            self.rows.add("learners", learner=lr.index, minibatches=lr.steps,
                          compute_time=lr.compute_time, wait_time=lr.wait_time,
                          samples=lr.steps * b, pull_time=0.0, push_time=lr.push_time,
                          overlap=lr.compute_time / max(busy, 1e-12), relayed_bytes=0,
                          cpu_time=lr.compute_time, run_time=end)  # fmt: skip
