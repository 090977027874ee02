"""Rudra-adv's aggregator tree in a simulation (``cluster.tree_fanout``; Gupta et al. §III-C,
Fig. 2): the real layout, the real aggregator's decisions, timed by the event loop.

The tree is the real one: ``pserver.plan.topology.make_layout`` builds it from the config (its
aggregators, and the parent of every learner and aggregator). An aggregator
(:class:`SimAggregator`) does what ``pserver.roles.aggregator.Aggregator`` does, in its order:

* upwards, it takes a child's push (a learner's gradient, or a child aggregator's sum with its
  (learner, timestamp) pairs), unless its block stopped; once every live child has pushed in
  this round (a fast child may push twice: both are summed and clocked) it relays one push with
  all the round's pairs (``maybe_forward``); the shard takes the pairs whole or drops them whole
  (``ShardBlock.accept``, through :meth:`SimShard.take`), so the vector clocks and σ it records
  are exact;
* downwards, it keeps one long poll out at its parent (weights newer than those it caches),
  caches what comes, and answers its children's pulls from the cache with the real rule
  (``pserver.protocols.pull.pull_answer``), holding those that ask for newer weights;
* a child's goodbye shrinks the live set (the round that waited for it is relayed), its held
  pulls get STOP, and a learner's retirement goes up to the shard (``Tag.RETIRE``), which
  retires it from its rounds as a flat shard does at a goodbye; once every child left it says
  goodbye to its parent and writes its ``aggregators`` row.

No arithmetic: the sums are not formed (``pserver.protocols.tree.add_gradient`` is the one rule
of the real aggregator that touches numbers). Each aggregator handles one message at a time as
the shard does (``sim.message_time``, plus ``sim.update_per_byte`` per byte of a pushed
gradient: receiving and adding it; CPU seconds on the shared cores of ``sim.cores``), and every
link of the tree (learner to aggregator, aggregator to aggregator, top aggregator to shard)
costs ``sim.tree_latency`` + bytes / ``sim.tree_bandwidth`` (0: ``sim.latency``,
``sim.bandwidth``), a reply's latency drawn as the shard's (``sim.latency_cv``). The versions an
aggregator serves from (``comm.versions``) are not limited here: a pull never waits for a free
version. The shard knows a top aggregator as λ + its index: an injected delay of its pull
(``inject.pull_delay_prob``) is drawn, and its ``delays`` row written, with that key, where the
real shard uses the aggregator's own index (``PullAnswers.on_pull``: ``layout.index``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pserver.plan.config import Config
from pserver.plan.topology import Layout, make_layout, tree_size
from pserver.protocols.pull import Reply, pull_answer
from pserver.sim.costs import Costs
from pserver.sim.rows import Rows
from pserver.sim.servers import Via
from pserver.sim.shard import BYE, PULL, PUSH, SimShard

BLOCK = 0  # the one block a tree is simulated with (pserver.sim.engine.check_one_block)
SUM, RETIRE = 3, 4  # an aggregator's relayed sum, a learner retired below it

Entries = tuple[tuple[int, int, int | None], ...]


def tree_costs(cfg: Config, costs: Costs) -> Costs:
    """The cost model with the tree's links in place of the flat learner-shard link."""
    s = cfg.sim
    link = replace(s, latency=s.tree_latency or s.latency,
                   bandwidth=s.tree_bandwidth or s.bandwidth)  # fmt: skip
    return replace(costs, sim=link)


def tree_layout(cfg: Config) -> Layout:
    """The real run's layout (``make_layout``: its aggregator tree and broadcast tree) at the
    world size its λ and fan-out need."""
    c = cfg.cluster
    ranks = c.servers + 2 + c.learners + tree_size(c.learners, c.tree_fanout)
    return make_layout(ranks, cfg)


class TreeShard(SimShard):
    """The shard of a tree: its children are the top aggregators. A relayed sum is taken with
    its pairs; a RETIRE retires one learner (``ServerShard.on_retire``); an aggregator's goodbye
    retires nobody (its learners were retired one by one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handlers[SUM] = self.on_sum
        self.handlers[RETIRE] = self.on_retire

    def on_sum(self, _sender: int, block: int, _ts: int, entries: Entries) -> None:
        self.take(block, list(entries))

    def on_retire(self, _sender: int, _block: int, learner: int, _extra: None) -> None:
        self.retire([learner])

    def on_bye(self, _sender: int, _block: int, _ts: int, _extra: int | None) -> None:
        self.live -= 1
        self.retire([])

    def retire(self, learners: list[int]) -> None:
        """``ServerShard.retire``: the rounds stop waiting for them; a round no gradient can
        complete any more closes with what it has."""
        now = self.loop.now
        for st in self.blocks.values():
            a = st.arith
            for learner in learners:
                a.protocol.retire(learner)
            if not a.done and a.in_round and (a.ready(now) or not self.live):
                self.update(st)
            self.answer_waiting(st)


class SimAggregator:
    """Aggregator ``index`` (the parent knows it as ``ident``: λ + index); see the module."""

    def __init__(self, index: int, ident: int, rank: int, loop: Any, costs: Costs, rows: Rows,
                 n_learners: int) -> None:  # fmt: skip
        self.index, self.ident, self.rank = index, ident, rank
        self.loop, self.costs, self.rows = loop, costs, rows
        self.n_learners = n_learners
        self.parent: Any = None  # an aggregator or the shard: ``arrive``
        self.children: dict[int, Any] = {}  # ident -> the child (its ``on_reply``)
        self.live: set[int] = set()
        self.ts = 0  # w0: every rank builds it
        self.stopped = False
        self.got: set[int] = set()  # children that pushed this round
        self.clock: list[tuple[int, int, int | None]] = []  # this round's (learner, ts) pairs
        self.waiting: list[tuple[int, int, int]] = []  # held pulls: (child, holds, accepts)
        self.requests: dict[int, int] = {}  # pulls per child: the reply latency draws' index
        self.queue: deque[tuple[int, int, int, Any]] = deque()
        self.busy = False
        self.link_free = 0.0  # when our last message reaches the parent (FIFO)
        self.left = False
        self.bytes_in = self.bytes_out = 0
        self.busy_time = 0.0
        # the engine's hooks shared with the learners: sim.cores (its CPU runs on them), the
        # statistics server (it writes no train rows, nor minibatches: ``steps``)
        self.cores: Any = None
        self.stats: Any = None
        self.steps = 0
        self.handlers: dict[int, Callable[..., None]] = {
            PUSH: self.on_push, SUM: self.on_sum, PULL: self.on_pull, BYE: self.on_bye,
            RETIRE: self.on_retire,
        }  # fmt: skip

    # -- the inbox: one message at a time -----------------------------------------------

    def arrive(self, kind: int, sender: int, _block: int, ts: int, extra: Any) -> None:
        """A child's message (``SimShard.arrive``'s form: the one block)."""
        self.queue.append((kind, sender, ts, extra))
        if not self.busy:
            self.serve_next()

    def push_and_pull(self, sender: int, block: int, ts: int, iteration: int | None,
                      accepts: int | None) -> None:  # fmt: skip
        """A blocking learner's push and the pull behind it (None: a pull is still out): two
        headers to an aggregator (a push and its pull share a header only to the shard itself,
        ``PSLink.joins_pull``)."""
        self.arrive(PUSH, sender, block, ts, iteration)
        if accepts is not None:
            self.arrive(PULL, sender, block, ts, accepts)

    def serve_next(self) -> None:
        msg = self.queue.popleft()
        self.busy = True
        s = self.costs.sim
        t = s.message_time + (s.update_per_byte * self.costs.nbytes if msg[0] in (PUSH, SUM)
                              else 0.0)  # fmt: skip
        self.busy_time += t
        if self.cores is not None:
            self.cores.run(t, self.served, msg)
        else:
            self.loop.after(t, self.served, msg)

    def served(self, msg: tuple[int, int, int, Any]) -> None:
        self.handlers[msg[0]](msg[1], msg[2], msg[3])
        self.busy = False
        if self.queue:
            self.serve_next()

    def send(self, payload: bool, kind: int, ts: int, extra: Any) -> None:
        """One message to the parent, in order (MPI's non-overtaking rule)."""
        now = self.loop.now
        at = max(now + self.costs.message(payload), self.link_free)
        self.link_free = at
        self.loop.after(at - now, self.parent.arrive, kind, self.ident, BLOCK, ts, extra)

    # -- downwards: the parent's weights, the children's pulls --------------------------

    def start(self) -> None:
        self.ask()

    def ask(self) -> None:
        """Long poll: the parent answers with the first weights newer than ours (or STOP)."""
        self.send(False, PULL, self.ts, self.ts + 1)

    def on_reply(self, _block: int, kind: Reply, ts: int) -> None:
        """The parent's answer to our long poll (read between messages: not queued)."""
        if self.left:  # the answer ``leave`` collects: received, not served
            if kind is Reply.WEIGHTS:
                self.bytes_in += self.costs.nbytes
            return
        if kind is Reply.STOP:
            self.stopped = True
        elif kind is Reply.WEIGHTS:
            self.bytes_in += self.costs.nbytes
            self.ts = ts
            self.ask()
        else:
            raise AssertionError(f"aggregator {self.index}: {kind!r} to a long poll")
        waiting, self.waiting = self.waiting, []
        for pull in waiting:
            self.on_pull(*pull)

    def on_pull(self, child: int, holds: int, accepts: int | None) -> None:
        answer = pull_answer(stopped=self.stopped, ts=self.ts, holds=holds,
                             accepts=int(accepts or 0))  # fmt: skip
        if answer is None:
            self.waiting.append((child, holds, int(accepts or 0)))
            return
        self.reply(child, answer)

    def reply(self, child: int, answer: Reply) -> None:
        self.bytes_out += send_answer(self, self.children[child], child, answer, self.ts)

    # -- upwards: the children's gradients ----------------------------------------------

    def on_push(self, child: int, ts: int, _iteration: int | None) -> None:
        """A learner's push (the tree runs the block rule: its iteration tag is not relayed)."""
        self.take(child, ((child, ts, None),))

    def on_sum(self, child: int, _ts: int, entries: Entries) -> None:
        self.take(child, entries)

    def take(self, child: int, entries: Entries) -> None:
        self.bytes_in += self.costs.nbytes
        if self.stopped:
            return  # training is over: the shard would drop it too
        self.got.add(child)
        self.clock.extend(entries)
        self.maybe_forward()

    def maybe_forward(self) -> None:
        """Relay the round once every live child has pushed (one that left is not awaited)."""
        if not self.got or not self.live <= self.got:
            return
        self.send(True, SUM, -1, tuple(self.clock))
        self.bytes_out += self.costs.nbytes
        self.got, self.clock = set(), []

    # -- goodbyes and retirements -------------------------------------------------------

    def on_bye(self, child: int, _ts: int, _extra: Any) -> None:
        self.live.discard(child)
        if not self.stopped:
            self.maybe_forward()
        mine = [p for p in self.waiting if p[0] == child]
        if mine:  # its held pulls (a child aggregator's long poll): STOP
            self.waiting = [p for p in self.waiting if p[0] != child]
            for _ in mine:
                self.reply(child, Reply.STOP)
        if child < self.n_learners:  # a learner: its retirement goes up to the shard
            self.send(False, RETIRE, child, None)
        if not self.live:
            self.leave()

    def on_retire(self, _child: int, learner: int, _extra: Any) -> None:
        self.send(False, RETIRE, learner, None)

    def leave(self) -> None:
        """Goodbye to the parent; the one answer our long poll still gets is collected."""
        self.left = True
        self.send(False, BYE, -1, None)
        self.rows.add("aggregators", aggregator=self.index, rank=self.rank, bytes_in=self.bytes_in,
                      bytes_out=self.bytes_out,
                      wait_time=max(self.loop.now - self.busy_time, 0.0),
                      cpu_time=self.busy_time, run_time=self.loop.now)  # fmt: skip


def plant(cfg: Config, loop: Any, costs: Costs, rows: Rows, shard: SimShard,
          learners: list[Any]) -> list[SimAggregator]:  # fmt: skip
    """Build the real layout's aggregators over ``learners`` (indexed as the layout's) and
    ``shard`` (the one shard); rewire each learner to its aggregator (its ``servers``: a
    ``pserver.sim.servers.Via``) and the tree's links. Returns the aggregators, each to be
    started (its first long poll) with the learners; the caller makes them the shard's pullers
    λ + index."""
    layout = tree_layout(cfg)
    n = len(learners)
    link = tree_costs(cfg, costs)
    ident = {r: i for i, r in enumerate(layout.learners)}
    ident.update({r: n + j for j, r in enumerate(layout.aggregators)})
    aggs = [SimAggregator(j, n + j, r, loop, link, rows, n)
            for j, r in enumerate(layout.aggregators)]
    node: dict[int, Any] = {i: learner for i, learner in enumerate(learners)}
    node.update({a.ident: a for a in aggs})
    shard.learners = [*learners, *aggs]  # the shard answers its pullers by ident
    shard.requests = [0] * len(shard.learners)
    shard.costs = link  # every message of the shard goes over a tree link
    shard.live = 0
    for rank, i in ident.items():
        up = layout.parent.get(rank)
        child = node[i]
        if up is None:  # a top aggregator: its parent is the shard (every learner has one)
            assert i >= n, f"learner {i} outside the tree"
            child.parent = shard
            shard.live += 1
            continue
        parent = node[ident[up]]
        parent.children[i] = child
        parent.live.add(i)
        if i < n:
            child.servers = Via(parent, child.servers.blocks, child.servers.nbytes)
            child.costs = replace(child.costs, sim=link.sim)
        else:
            child.parent = parent
    return aggs


# -- the broadcast tree (cluster.bcast_fanout) ------------------------------------------------


class Children:
    """A relaying learner's children in Rudra-adv*'s broadcast tree (``pserver.roles.bcast``):
    their pulls answered from the model it computes with (``pull_answer`` on its installed
    timestamp), those for newer weights held until it installs them or stops; their goodbyes
    counted (it says its own only once every child said one). Under ``comm.mode =
    "nonblocking"`` a learner makes progress only while it waits: what its children send while
    it computes is read when the compute ends; under ``"thread"`` at once. The versions it
    serves from (``comm.versions``) are not limited here. No checkpoint cut is simulated, so
    ``Reply.LEFT`` is never sent."""

    def __init__(self, learner: Any, costs: Costs, nonblocking: bool) -> None:
        self.learner, self.costs, self.nonblocking = learner, costs, nonblocking
        self.loop = learner.loop
        self.kids: dict[int, Any] = {}
        self.live: set[int] = set()
        self.waiting: list[tuple[int, int, int]] = []  # pulls for weights newer than ours
        self.inbox: list[tuple[int, int, int, Any]] = []  # read at our next wait (nonblocking)
        self.requests: dict[int, int] = {}
        self.relayed_bytes = 0

    def arrive(self, kind: int, child: int, ts: int, extra: Any) -> None:
        """A child's pull or goodbye (``OverlapLearner.arrive`` hands it on)."""
        if self.nonblocking and self.learner.computing:
            self.inbox.append((kind, child, ts, extra))
            return
        self.on_message(kind, child, ts, extra)

    def progress(self) -> None:
        inbox, self.inbox = self.inbox, []
        for msg in inbox:
            self.on_message(*msg)

    def on_message(self, kind: int, child: int, ts: int, extra: Any) -> None:
        if kind == BYE:
            self.live.discard(child)
            self.learner.waited()
        elif kind == PULL:
            self.serve(child, ts, int(extra or 0))
        else:
            raise AssertionError(f"learner {self.learner.index} got message {kind} from {child}")

    def serve(self, child: int, holds: int, accepts: int) -> None:
        me = self.learner
        answer = pull_answer(stopped=me.stopped, ts=me.have, holds=holds, accepts=accepts)
        if answer is None:
            self.waiting.append((child, holds, accepts))
            return
        self.relayed_bytes += send_answer(self, self.kids[child], child, answer, me.have)

    def answer(self) -> None:
        """Serve again the pulls that waited for weights newer than ours."""
        waiting, self.waiting = self.waiting, []
        for pull in waiting:
            self.serve(*pull)

    def drained(self) -> bool:
        return not self.live


def send_answer(node: Any, to: Any, child: int, answer: Reply, ts: int) -> int:
    """An aggregator's or a relaying learner's answer to a child's pull, on its way: counted
    as the child's next request (the delay draws' index), timed by the node's link costs and
    delivered as ``to.on_reply``; returns the payload bytes it sent (0 without weights)."""
    request = node.requests.get(child, 0)
    node.requests[child] = request + 1
    payload = answer is Reply.WEIGHTS
    trip = node.costs.reply(payload, child, request)
    node.loop.after(trip, to.on_reply, BLOCK, answer, ts)
    return node.costs.nbytes if payload else 0


def bcast_costs(cfg: Config, costs: Costs) -> Costs:
    """The cost model with the broadcast tree's learner-to-learner link."""
    s = cfg.sim
    link = replace(s, latency=s.bcast_latency or s.latency,
                   bandwidth=s.bcast_bandwidth or s.bandwidth)  # fmt: skip
    return replace(costs, sim=link)


def plant_bcast(cfg: Config, costs: Costs, learners: list[Any]) -> None:
    """The real layout's broadcast tree (``pserver.plan.topology.broadcast_tree``, by
    ``cluster.bcast_fanout`` and ``cluster.bcast_tree``) over the overlapped ``learners``: each
    child pulls from its parent learner over the broadcast link."""
    layout = tree_layout(cfg)
    index = {r: i for i, r in enumerate(layout.learners)}
    link = bcast_costs(cfg, costs)
    nonblocking = cfg.comm.mode == "nonblocking"
    for rank, up in layout.bcast_parent.items():
        child, parent = learners[index[rank]], learners[index[up]]
        child.source, child.source_costs = parent, link
        if parent.kids is None:
            parent.kids = Children(parent, link, nonblocking)
        parent.kids.kids[child.index] = child
        parent.kids.live.add(child.index)
