"""A simulated learner: the blocking parameter-server exchange (``pserver.roles.learner``) timed.

A step is what ``Trainer.step`` does with ``PSExchange``: wait for the pull (none before the
first minibatch: it runs on w0), fetch a minibatch, compute, push each live block's gradient to
its shard with the timestamp of the block it came from, each followed at once by a pull request
for that block unless one is still out (``PSExchange.push``). The pushes leave one after the
other on the learner's link: block k arrives ``latency`` + the bytes of blocks 0..k /
``bandwidth`` after the push began. Which weights a pull asks for, and what a reply means, are
decided by the learner's own ``PullRule`` and ``PartialPull`` (``pserver.protocols.partial_pull``),
as in a real learner: under partial pulling (PSP-SGD Algorithm 1, worker lines 7-15) it computes
once ``ceil(b · blocks)`` of them came back fresh and ``tau2`` more seconds passed, keeping its
copy of the others, whose requests stay out and are judged when they land. The learner stops
once every block answered STOP, and says goodbye to every shard. Its ``train`` row has the real
row's columns; ``loss`` and ``error`` are NaN (nothing is computed; the dump's ``simulated``
attribute says so).
"""

from __future__ import annotations

from typing import Any

from pserver.protocols.partial_pull import REFRESH, USE, PartialPull, PullRule
from pserver.protocols.pull import Reply
from pserver.sim.cores import Cores, Serial
from pserver.sim.costs import Costs
from pserver.sim.rows import Rows
from pserver.sim.shard import BYE, PULL

NAN = float("nan")


class DataServer:
    """The data server as one FIFO queue of ``sim.data_time`` seconds per minibatch; a learner
    asks for its next minibatch when it starts computing one (the prefetcher's one ahead)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.free = 0.0

    def request(self, now: float) -> float:
        """When a minibatch asked for at ``now`` is ready."""
        if self.seconds <= 0.0:
            return now
        self.free = max(now, self.free) + self.seconds
        return self.free


class SimLearner:
    __slots__ = (
        "index", "loop", "costs", "rows", "servers", "data", "partial", "rule", "have", "steps",
        "stopped", "asked", "pull_since", "ready_at", "inbox", "next_batch", "compute_time",
        "pull_time", "compute_now", "finished_at", "batch", "pulling", "train", "freezes",
        "cores", "stats", "cpu_used", "began", "wait_since", "timed", "out", "stops",
    )  # fmt: skip

    def __init__(
        self, index: int, loop: Any, costs: Costs, rows: Rows, servers: Any, data: DataServer,
        rule: PullRule, fraction: float, tau2: float,
    ) -> None:  # fmt: skip
        self.index, self.loop, self.costs, self.rows = index, loop, costs, rows
        self.servers, self.data, self.rule = servers, data, rule  # pserver.sim.servers.Servers
        n_blocks = len(servers.blocks)
        self.partial = PartialPull(n_blocks, fraction, tau2)
        # every rank builds w0: a learner starts at timestamp 0 of every block without a pull
        self.have = [0] * n_blocks
        self.steps = 0
        # per block, 1 where it answered STOP / has a pull request out (a bytearray, not a set:
        # 100,000 learners' empty sets cost 50 MiB), and how many of each
        self.stopped, self.stops = bytearray(n_blocks), 0
        self.asked, self.out = bytearray(n_blocks), 0
        self.pulling = False  # waiting in a pull (``PSExchange.pull``)
        self.pull_since = 0.0
        self.ready_at = 0.0  # the end of a freeze or of the step's own overhead
        self.inbox: list[tuple[int, Reply, int]] = []  # replies landed before the pull began
        self.timed = -1  # the iteration whose τ2 deadline has an event
        self.next_batch = 0.0
        self.compute_time = self.pull_time = self.compute_now = 0.0
        self.finished_at = 0.0
        self.batch = costs.batch
        self.train = rows.train()
        self.freezes = index == costs.plan.freeze_learner  # inject.freeze_*
        self.cores: Cores | None = None  # sim.cores: the node's processors, set by the engine
        self.stats: Serial | None = None  # and the statistics server's CPU on them
        self.cpu_used = 0.0  # CPU s of this learner (its learners row's cpu_time)
        self.began = 0.0  # when the compute in progress began (after the fetch)
        self.wait_since = 0.0  # when the wait in progress began (the pull, or a pull asked again)

    def start(self) -> None:
        self.next_batch = self.data.request(self.loop.now)
        self.compute(0.0)

    def compute(self, pull: float) -> None:
        """Weights in hand (after ``pull`` seconds of waiting): fetch, compute, then push."""
        now = self.loop.now
        begin = max(now, self.next_batch)
        self.next_batch = self.data.request(begin)
        if self.cores is not None:
            self.began = begin
            if begin > now:
                self.loop.after(begin - now, self.compute_shared, pull, begin - now)
            else:
                self.compute_shared(pull, 0.0)
            return
        c = self.costs.compute(self.index, self.steps)
        self.compute_now = c
        self.cpu_used += c - self.costs.compute_sleep(self.index)  # the model's part: CPU
        self.loop.after(begin - now + c, self.computed, pull, begin - now)

    # -- the compute on shared cores (sim.cores): the model's CPU, then the emulated sleep ------

    def compute_shared(self, pull: float, fetch: float) -> None:
        cpu = self.costs.compute_cpu(self.index, self.steps)
        self.cpu_used += cpu
        self.cores.run(cpu, self.compute_sleep, pull, fetch)  # type: ignore[union-attr]

    def compute_sleep(self, pull: float, fetch: float) -> None:
        sleep = self.costs.compute_sleep(self.index)
        self.compute_now = self.loop.now + sleep - self.began  # the compute as the trainer times it
        if sleep > 0.0:
            self.loop.after(sleep, self.computed, pull, fetch)
        else:
            self.computed(pull, fetch)

    def computed(self, pull: float, fetch: float) -> None:
        """``Trainer.step`` after the compute: push and ask (``PSExchange.push``), the row."""
        now = self.loop.now
        c = self.compute_now
        self.compute_time += c
        self.pull_time += pull
        self.train.append((self.index, self.steps, now, NAN, NAN, c, pull + fetch, pull, 0.0,
                           self.partial.stale_fraction, self.partial.dropped))
        if self.train.full():
            self.rows.write(self.train)
        sim = self.costs.sim
        freeze = self.costs.plan.freeze_for(self.index, self.steps) if self.freezes else 0.0
        self.steps += 1
        self.push()
        if self.stats is not None:
            self.stats.submit(sim.other_cpu)  # the statistics server takes the row
        if self.cores is not None:  # the step's CPU (overhead, sends and polls) after a freeze
            self.ready_at = now + freeze
            self.loop.after(freeze, self.step_shared)
            return
        self.ready_at = now + freeze + sim.step_overhead
        self.loop.after(freeze + sim.step_overhead, self.pull)

    def push(self) -> None:
        """``PSExchange.push``: every live block's gradient, in block order, each followed by
        its pull request unless one is out (the shard reads them in that order)."""
        servers, costs, have = self.servers, self.costs, self.have
        iteration = self.rule.push_iteration()
        sent = 0
        for b, shard in enumerate(servers.of):
            if self.stopped[b]:
                continue
            sent += servers.nbytes[b]
            accepts = None
            if not self.asked[b]:
                self.asked[b] = 1
                self.out += 1
                accepts = self.rule.oldest(have[b])
            self.loop.after(costs.sim.latency + costs.payload(sent), shard.push_and_pull,
                            self.index, b, have[b], iteration, accepts)  # fmt: skip

    def step_shared(self) -> None:
        cpu = self.costs.step_cpu()
        if cpu > 0.0:
            self.cpu_used += cpu
            self.cores.run(cpu, self.pull)  # type: ignore[union-attr]
        else:
            self.pull()

    # -- the pull (PSExchange.pull, on_reply) ----------------------------------------------------

    def pull(self) -> None:
        """Ask each live block not asked yet for weights newer than ours; judge the replies
        that landed meanwhile; wait until the partial pull is ready."""
        now = self.loop.now
        self.pulling = True
        self.pull_since = self.wait_since = now
        oldest, have = self.rule.oldest, self.have
        live = [b for b in range(len(have)) if not self.stopped[b]]
        self.partial.start(now, {b: oldest(have[b]) for b in live})
        for b in live:
            if not self.asked[b]:
                self.ask(b)
        inbox, self.inbox = self.inbox, []
        for block, kind, ts in inbox:
            self.take(block, kind, ts)
        self.check_done()

    def on_reply(self, block: int, kind: Reply, ts: int) -> None:
        if not self.pulling:  # landed while computing or frozen: read when the pull begins
            self.inbox.append((block, kind, ts))
            return
        if self.costs.poll is not None:  # sim.polls: seen at the wait's next test
            waited = self.loop.now - self.wait_since
            late = self.costs.seen(waited) - waited
            if late > 0.0:
                self.loop.after(late, self.on_seen, block, kind, ts)
                return
        self.on_seen(block, kind, ts)

    def on_seen(self, block: int, kind: Reply, ts: int) -> None:
        if not self.pulling:  # seen after the pull ended (its τ2 ran out): the next one reads it
            self.inbox.append((block, kind, ts))
            return
        self.take(block, kind, ts)
        self.check_done()

    def take(self, b: int, kind: Reply, ts: int) -> None:
        """``PSExchange.on_reply`` for block ``b``."""
        self.asked[b] = 0  # every reply answers the one request out for its block
        self.out -= 1
        now = self.loop.now
        if kind is Reply.STOP:
            self.stopped[b] = 1
            self.stops += 1
            self.partial.forget(b, now)  # done: never wait for it again
        elif kind is Reply.CURRENT:
            # our copy is fresh enough, unless the iteration rule's requirement rose meanwhile
            if not self.partial.on_block(b, ts, now):
                self.ask(b)
        else:
            verdict = self.partial.judge(b, ts, self.have[b], now)
            if verdict == USE:
                self.have[b] = ts
            elif not self.stopped[b]:  # older than this iteration needs: ask again
                if verdict == REFRESH:
                    self.have[b] = ts
                self.ask(b)

    def ask(self, b: int) -> None:
        self.asked[b] = 1
        self.out += 1
        self.wait_since = self.loop.now
        self.loop.after(self.costs.message(False), self.servers.of[b].arrive, PULL, self.index,
                        b, self.have[b], self.rule.oldest(self.have[b]))

    def check_done(self) -> None:
        """The pull's end (``PSExchange.pull``'s ``done``): no request out, or the partial pull
        ready; else, once ``b`` of the blocks are in, an event at its ``tau2`` deadline."""
        now = self.loop.now
        partial = self.partial
        if self.out and not partial.ready(now):
            due = partial.deadline()
            if due is not None and self.timed != partial.iteration:
                self.timed = partial.iteration
                if self.costs.poll is not None:  # seen at the wait's next test
                    due = self.wait_since + self.costs.seen(due - self.wait_since)
                self.loop.after(max(due - now, 0.0), self.on_deadline, partial.iteration)
            return
        self.pulling = False
        self.rule.pulled({b: ts for b, ts in enumerate(self.have) if not self.stopped[b]})
        if self.stops == len(self.have):
            self.finish()
            return
        self.compute(now - self.pull_since)

    def on_deadline(self, iteration: int) -> None:
        """τ2 ran out in the pull of ``iteration`` (if that pull still waits)."""
        if self.pulling and self.partial.iteration == iteration:
            self.check_done()

    def finish(self) -> None:
        """Goodbye to every shard (``PSLink.goodbye``) and the ``learners`` row."""
        now = self.loop.now
        self.finished_at = now
        for shard in self.servers.shards:
            self.loop.after(self.costs.message(False), shard.arrive, BYE, self.index, -1, -1,
                            None)  # fmt: skip
        busy = self.compute_time + self.pull_time
        self.rows.add("learners", learner=self.index, minibatches=self.steps,
                      compute_time=self.compute_time, wait_time=self.pull_time,
                      samples=self.steps * self.batch, pull_time=self.pull_time, push_time=0.0,
                      overlap=self.compute_time / max(busy, 1e-12), relayed_bytes=0,
                      cpu_time=self.cpu_used + (0.0 if self.cores is not None else
                                                self.steps * self.costs.sim.step_overhead),
                      run_time=now)
