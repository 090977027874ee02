"""A simulated overlapped learner (``comm.mode`` = nonblocking | thread): Rudra-adv*'s exchange
(``pserver.roles.overlap.OverlapExchange``) timed by the event loop.

The learner computes its next minibatch while its push (and its pull) travel. It follows the
real exchange step by step, with the real bound on its in-flight pushes, the
``pserver.protocols.inflight.InflightWindow`` (``comm.max_inflight``; its docstring bounds the
staleness this leaves and proves the waits live):

* ``weights()``: wait until the run ended, a complete model arrived (installed: the timestamp it
  holds becomes the reply's; then the blocks asked again: hardsync and PSP post their next long
  poll for newer weights, async and softsync ask the blocks the window calls uncovered) or the
  next minibatch may be computed on the installed model (``may_go``: hardsync and PSP never
  before a new model, the others while the window allows). The first minibatch runs on w0;
  hardsync and PSP post their first long poll before it, async and softsync ask only after their
  first push.
* then ``inject.freeze_*`` (after the weights, as ``freeze_after_weights`` says), the minibatch
  from the data server, the compute;
* ``gradient()``: wait until the previous push was delivered (two gradient buffers: a push never
  starts before the last one left), push with the timestamp the gradient was computed on, count
  it in the window and, when no request is out and no answer waits, ask the uncovered blocks;
  the ``train`` row (``pull_time``: the weights wait, ``push_time``: this wait);
* once every block answered STOP: ``done()`` waits for the last push and for the answers to
  the requests still out, writes the ``learners`` row and says goodbye.

Messages between a learner and its shard keep their order (MPI's non-overtaking rule: a push's
header, the pull behind it and the goodbye reach the shard in the order sent): each arrives at
the later of its own travel time (``Costs.message``) and the previous one's arrival. A push is
delivered when its payload reached the shard (an eager send). ``nonblocking`` and ``thread``
are simulated alike: the replies are taken as they arrive and the push is delivered during the
compute in both, which holds where the payload goes eagerly (small models: MPICH's eager limit
is tens of KiB); a large push under ``nonblocking`` progresses only while the learner waits, not
modelled. With ``sim.cores`` its model compute and its step's CPU run on the shared cores as
the blocking learner's do (``pserver.sim.learner``); ``sim.polls`` is refused.
"""

from __future__ import annotations

from typing import Any

from pserver.errors import ConfigError
from pserver.plan.config import Config
from pserver.protocols.inflight import InflightWindow, inflight_limit
from pserver.protocols.partial_pull import PullRule
from pserver.protocols.pull import Reply
from pserver.sim.cores import Cores, Serial
from pserver.sim.costs import Costs
from pserver.sim.rows import Rows
from pserver.sim.shard import BYE, PULL, PUSH

NAN = float("nan")
BLOCK = 0  # the one block (several: refused, pserver.sim.engine.check_one_block)


class OverlapLearner:
    """Learner ``index``'s overlapped exchange (see the module); ``limit``: ``comm.max_inflight``
    as the real exchange reads it (None where the strategy waits for every update)."""

    def __init__(
        self, index: int, loop: Any, costs: Costs, rows: Rows, servers: Any, data: Any,
        rule: PullRule, fraction: float, tau2: float, *, max_inflight: int = 0,
    ) -> None:  # fmt: skip
        del fraction, tau2  # overlap refuses partial pulling (check_overlap)
        self.index, self.loop, self.costs, self.rows = index, loop, costs, rows
        # pserver.sim.servers.Servers (one shard, one block), or Via: our aggregator
        self.servers, self.data = servers, data
        self.waits = rule.waits_for_update  #: hardsync, psp
        self.window = None if self.waits else InflightWindow(inflight_limit(max_inflight),
                                                             [BLOCK])  # fmt: skip
        self.have = 0  # every rank builds w0: the first minibatch runs on timestamp 0
        self.arrived: int | None = None  # a WEIGHTS answer's timestamp, not yet installed
        self.current = False  # a CURRENT answer, not yet installed
        self.asked = False  # a request is out
        self.stopped = False
        self.steps = 0
        self.link_free = 0.0  # when our last message reaches the shard (FIFO)
        # the broadcast tree (cluster.bcast_fanout; pserver.sim.tree): our parent learner and
        # its link, and our children (set by pserver.sim.tree.plant_bcast)
        self.source: Any = None
        self.source_costs = costs
        self.source_free = 0.0
        self.kids: Any = None
        self.computing = False  # nonblocking: children's messages wait for our next wait
        self.delivered = 0.0  # when our last push's payload reached the shard
        self.waiting: str | None = None  # the wait in progress: "weights" or "done"
        self.need_new = False
        self.since = 0.0  # when the wait in progress began
        self.next_batch = 0.0
        self.compute_time = self.pull_time = self.push_time = self.blocked = 0.0
        self.finished_at = 0.0
        self.batch = costs.batch
        self.train = rows.train()
        self.freezes = index == costs.plan.freeze_learner
        self.cores: Cores | None = None  # sim.cores: the node's processors, set by the engine
        self.stats: Serial | None = None  # and the statistics server's CPU on them
        self.cpu_used = 0.0  # CPU s of this learner (its learners row's cpu_time)

    # -- messages to the shard, in order --------------------------------------------------

    def send(self, payload: bool, kind: int, ts: int, extra: int | None) -> float:
        """One message to the shard (or our aggregator); returns when it arrives there (never
        before the last)."""
        now = self.loop.now
        at = max(now + self.costs.message(payload), self.link_free)
        self.link_free = at
        self.loop.after(at - now, self.servers.of[BLOCK].arrive, kind, self.index, BLOCK, ts,
                        extra)  # fmt: skip
        return at

    def send_source(self, kind: int, ts: int, extra: int | None) -> None:
        """A header to where our weights come from: the shard, or our broadcast-tree parent
        (``pserver.sim.tree.Children``, over its link: ``sim.bcast_latency``)."""
        if self.source is None:
            self.send(False, kind, ts, extra)
            return
        now = self.loop.now
        at = max(now + self.source_costs.message(False), self.source_free)
        self.source_free = at
        self.loop.after(at - now, self.source.arrive, kind, self.index, BLOCK, ts, extra)

    def ask(self) -> None:
        """A pull request: for weights of any age under the window (answered at once), else a
        long poll for weights newer than ours (``OverlapExchange.ask``)."""
        self.asked = True
        self.send_source(PULL, self.have, 0 if self.window is not None else self.have + 1)

    def ask_all(self) -> None:
        if not self.stopped and not self.asked and self.arrived is None and not self.current:
            self.ask()

    def ask_uncovered(self) -> None:
        assert self.window is not None
        for block in self.window.uncovered():
            if not self.asked:
                self.ask()
                self.window.ask(block)

    # -- replies (OverlapExchange.on_reply, through the progress engine) ------------------

    def on_reply(self, _block: int, kind: Reply, ts: int) -> None:
        self.asked = False
        w = self.window
        if kind is Reply.STOP:
            self.stopped = True
            if w is not None:
                w.stop(BLOCK)
        elif kind is Reply.WEIGHTS:
            self.arrived = ts
            if w is not None:
                w.answer(BLOCK)
        elif kind is Reply.CURRENT and w is not None:
            self.current = True
            w.answer(BLOCK)
        else:  # a long poll asks for newer weights: the real exchange raises WireError
            raise AssertionError(f"learner {self.index}: {kind!r} to a long poll")
        if kind is Reply.STOP and self.kids is not None:
            self.kids.answer()
        if self.waiting == "weights":
            self.weights()
        elif self.waiting == "done":
            self.done()

    # -- the step (Trainer.step with OverlapExchange) -------------------------------------

    def start(self) -> None:
        self.next_batch = self.data.request(self.loop.now)
        if self.window is None:  # hardsync, psp: the long poll is out before the first minibatch
            self.ask_all()
        self.begin_weights()

    def begin_weights(self) -> None:
        self.need_new = self.waits and self.steps > 0
        self.since = self.loop.now
        self.weights()

    def model_ready(self) -> bool:
        return not self.stopped and (self.arrived is not None or self.current)

    def may_go(self) -> bool:
        return not self.need_new and (self.window is None or self.window.may_compute())

    def weights(self) -> None:
        """``OverlapExchange.weights``: the wait, the install, the go (twice at most)."""
        while True:
            if not (self.stopped or self.model_ready() or self.may_go()):
                self.waiting = "weights"
                return
            self.waiting = None
            if self.stopped:
                self.pull_time += self.loop.now - self.since
                self.since = self.loop.now
                self.done()
                return
            if self.model_ready():
                self.install()
                self.need_new = False
            if self.may_go():
                self.compute(self.loop.now - self.since)
                return

    def install(self) -> None:
        if self.arrived is not None:
            self.have = self.arrived
        self.arrived, self.current = None, False
        if self.window is None:
            self.ask_all()
        else:
            self.window.install()
            self.ask_uncovered()
        if self.kids is not None:
            self.kids.answer()

    def compute(self, pull: float) -> None:
        now = self.loop.now
        freeze = self.costs.plan.freeze_for(self.index, self.steps) if self.freezes else 0.0
        begin = max(now + freeze, self.next_batch)
        self.next_batch = self.data.request(begin)
        fetch = begin - now - freeze
        self.computing = True
        if self.cores is not None:  # sim.cores: the model's CPU on the shared cores, then sleep
            self.loop.after(begin - now, self.compute_shared, pull, fetch, begin)
            return
        c = self.costs.compute(self.index, self.steps)
        self.cpu_used += c - self.costs.compute_sleep(self.index)
        self.loop.after(begin - now + c, self.computed, pull, fetch, c)

    def compute_shared(self, pull: float, fetch: float, began: float) -> None:
        cpu = self.costs.compute_cpu(self.index, self.steps)
        self.cpu_used += cpu
        self.cores.run(cpu, self.compute_sleep, pull, fetch, began)  # type: ignore[union-attr]

    def compute_sleep(self, pull: float, fetch: float, began: float) -> None:
        sleep = self.costs.compute_sleep(self.index)
        c = self.loop.now + sleep - began  # the compute as the trainer times it
        self.loop.after(sleep, self.computed, pull, fetch, c)

    def computed(self, pull: float, fetch: float, c: float) -> None:
        """``gradient()``: the previous push delivered, then this one, and the row."""
        self.computing = False
        if self.kids is not None:  # nonblocking: what the children sent meanwhile, read now
            self.kids.progress()
        push = max(self.delivered - self.loop.now, 0.0)
        if push > 0.0:
            self.loop.after(push, self.pushed, pull, fetch, c, push)
        else:
            self.pushed(pull, fetch, c, 0.0)

    def pushed(self, pull: float, fetch: float, c: float, push: float) -> None:
        self.delivered = self.send(True, PUSH, self.have, None)
        w = self.window
        if w is not None:
            w.push()
            if not self.asked and self.arrived is None and not self.current:
                self.ask_uncovered()
        now = self.loop.now
        self.compute_time += c
        self.pull_time += pull
        self.push_time += push
        self.train.append((self.index, self.steps, now, NAN, NAN, c, pull + fetch + push, pull,
                           push, 0.0, 0))  # fmt: skip
        self.rows.check(self.train)
        self.steps += 1
        if self.stats is not None:
            self.stats.submit(self.costs.sim.other_cpu)  # the statistics server takes the row
        if self.cores is not None:  # the step's CPU (overhead, sends and polls) on the cores
            cpu = self.costs.step_cpu()
            self.cpu_used += cpu
            self.cores.run(cpu, self.begin_weights)
            return
        overhead = self.costs.sim.step_overhead
        self.cpu_used += overhead
        if overhead > 0.0:
            self.loop.after(overhead, self.begin_weights)
        else:
            self.begin_weights()

    # -- the end (OverlapExchange.done, finish; Trainer.report) ---------------------------

    def done(self) -> None:
        """Wait for the last push's delivery and the answers to the requests still out."""
        now = self.loop.now
        if self.delivered > now:
            self.waiting = None
            self.loop.after(self.delivered - now, self.done)
            return
        if self.asked or (self.kids is not None and not self.kids.drained()):
            self.waiting = "done"  # our last answers, then our children's goodbyes
            return
        self.waiting = None
        self.finish()

    def finish(self) -> None:
        now = self.loop.now
        self.blocked = now - self.since
        self.push_time += self.blocked  # the trainer adds done()'s blocked seconds to the pushes
        self.finished_at = now
        self.send(False, BYE, -1, None)
        if self.source is not None:  # goodbye to every upstream rank (PSLink.say_bye)
            self.send_source(BYE, -1, None)
        busy = self.compute_time + self.pull_time + self.push_time
        self.rows.add("learners", learner=self.index, minibatches=self.steps,
                      compute_time=self.compute_time, wait_time=self.pull_time + self.push_time,
                      samples=self.steps * self.batch, pull_time=self.pull_time,
                      push_time=self.push_time, overlap=self.compute_time / max(busy, 1e-12),
                      relayed_bytes=self.kids.relayed_bytes if self.kids is not None else 0,
                      cpu_time=self.cpu_used, run_time=now)  # fmt: skip

    def arrive(self, kind: int, child: int, _block: int, ts: int, extra: int | None) -> None:
        """A child's pull or goodbye (we relay weights in the broadcast tree)."""
        self.kids.arrive(kind, child, ts, extra)

    def waited(self) -> None:
        """A child's goodbye may end our ``done()`` wait."""
        if self.waiting == "done":
            self.done()


def check_overlap(cfg: Config) -> None:
    """``ConfigError`` for what this engine does not simulate with ``comm.mode`` ≠ blocking:
    ``sim.polls`` (the communication thread's and the waits' polls are not modelled)."""
    if cfg.comm.mode != "blocking" and cfg.sim.polls:
        raise ConfigError(
            f"sim.polls is not simulated with comm.mode = {cfg.comm.mode!r} (the overlapped "
            'learner, pserver/sim/overlap.py): unset sim.polls, or simulate comm.mode = '
            '"blocking"'
        )
