"""A simulated learner: the blocking parameter-server exchange (``pserver.roles.learner``) timed.

A step is what ``Trainer.step`` does with ``PSExchange``: wait for the pull (none before the
first minibatch: it runs on w0), fetch a minibatch, compute, push the gradient with the
timestamp of the weights it came from and ask at once for newer weights. Which weights a pull
asks for, and what a reply means, are decided by the learner's own ``PullRule`` and
``PartialPull`` (``pserver.protocols.partial_pull``), as in a real learner. Its ``train`` row
has the real row's columns; ``loss`` and ``error`` are NaN (nothing is computed; the dump's
``simulated`` attribute says so).
"""

from __future__ import annotations

from typing import Any

from pserver.protocols.partial_pull import USE, PartialPull, PullRule
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
        "index", "loop", "costs", "rows", "shard", "data", "partial", "rule", "have", "steps",
        "stopped", "asked", "pull_since", "ready_at", "inbox", "next_batch", "compute_time",
        "pull_time", "compute_now", "finished_at", "batch", "pulling", "train", "freezes",
        "cores", "stats", "cpu_used", "began", "wait_since",
    )  # fmt: skip

    def __init__(
        self, index: int, loop: Any, costs: Costs, rows: Rows, shard: Any, data: DataServer,
        rule: PullRule, fraction: float, tau2: float,
    ) -> None:  # fmt: skip
        self.index, self.loop, self.costs, self.rows = index, loop, costs, rows
        self.shard, self.data, self.rule = shard, data, rule
        self.partial = PartialPull(1, fraction, tau2)
        self.have = 0  # every rank builds w0: a learner starts at timestamp 0 without a pull
        self.steps = 0
        self.stopped = False
        self.asked = False  # a pull request is out
        self.pulling = False  # waiting in a pull (``PSExchange.pull``)
        self.pull_since = 0.0
        self.ready_at = 0.0  # the end of a freeze or of the step's own overhead
        self.inbox: list[tuple[Reply, int]] = []  # replies landed before the pull began
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
        self.asked = True
        self.loop.after(self.costs.message(True), self.shard.push_and_pull, self.index,
                        self.have, self.rule.push_iteration(), self.rule.oldest(self.have))
        if self.stats is not None:
            self.stats.submit(sim.other_cpu)  # the statistics server takes the row
        if self.cores is not None:  # the step's CPU (overhead, sends and polls) after a freeze
            self.ready_at = now + freeze
            self.loop.after(freeze, self.step_shared)
            return
        self.ready_at = now + freeze + sim.step_overhead
        self.loop.after(freeze + sim.step_overhead, self.pull)

    def step_shared(self) -> None:
        cpu = self.costs.step_cpu()
        if cpu > 0.0:
            self.cpu_used += cpu
            self.cores.run(cpu, self.pull)  # type: ignore[union-attr]
        else:
            self.pull()

    # -- the pull (PSExchange.pull, on_reply) ----------------------------------------------------

    def pull(self) -> None:
        self.pulling = True
        self.pull_since = self.wait_since = self.loop.now
        self.partial.start(self.loop.now, {0: self.rule.oldest(self.have)})
        inbox, self.inbox = self.inbox, []
        for kind, ts in inbox:
            self.take(kind, ts)
        self.check_done()

    def on_reply(self, kind: Reply, ts: int) -> None:
        if not self.pulling:  # landed during a freeze: read when the pull begins
            self.inbox.append((kind, ts))
            return
        if self.costs.poll is not None:  # sim.polls: seen at the wait's next test
            waited = self.loop.now - self.wait_since
            late = self.costs.seen(waited) - waited
            if late > 0.0:
                self.loop.after(late, self.on_seen, kind, ts)
                return
        self.on_seen(kind, ts)

    def on_seen(self, kind: Reply, ts: int) -> None:
        self.take(kind, ts)
        self.check_done()

    def take(self, kind: Reply, ts: int) -> None:
        self.asked = False
        now = self.loop.now
        if kind is Reply.STOP:
            self.stopped = True
            self.partial.forget(0, now)
        elif kind is Reply.CURRENT:
            if not self.partial.on_block(0, ts, now):
                self.ask()
        else:
            verdict = self.partial.judge(0, ts, self.have, now)
            if verdict == USE:
                self.have = ts
            else:  # too old for this iteration (a newer copy still replaces ours): again
                self.have = max(self.have, ts)
                self.ask()

    def ask(self) -> None:
        self.asked = True
        self.wait_since = self.loop.now
        self.loop.after(self.costs.message(False), self.shard.arrive, PULL, self.index,
                        self.have, self.rule.oldest(self.have))

    def check_done(self) -> None:
        if self.asked and not self.partial.ready(self.loop.now):
            return
        self.pulling = False
        if self.stopped:
            self.finish()
            return
        self.rule.pulled({0: self.have})
        self.compute(self.loop.now - self.pull_since)

    def finish(self) -> None:
        """Goodbye to the shard (``PSLink.goodbye``) and the ``learners`` row."""
        now = self.loop.now
        self.finished_at = now
        self.loop.after(self.costs.message(False), self.shard.arrive, BYE, self.index, -1, None)
        busy = self.compute_time + self.pull_time
        self.rows.add("learners", learner=self.index, minibatches=self.steps,
                      compute_time=self.compute_time, wait_time=self.pull_time,
                      samples=self.steps * self.batch, pull_time=self.pull_time, push_time=0.0,
                      overlap=self.compute_time / max(busy, 1e-12), relayed_bytes=0,
                      cpu_time=self.cpu_used + (0.0 if self.cores is not None else
                                                self.steps * self.costs.sim.step_overhead),
                      run_time=now)
