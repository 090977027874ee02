"""PSP-SGD partial pulling (Algorithm 1, worker lines 3-15) with scripted block replies."""

from __future__ import annotations

import heapq
import itertools
import math
import random

import pytest

from pserver.errors import ConfigError
from pserver.plan.config import load_config, pull_timestamp
from pserver.protocols import Arrival
from pserver.protocols.partial_pull import (
    BLOCK,
    DROP,
    ITERATION,
    REFRESH,
    USE,
    PartialPull,
    PullRule,
)
from pserver.protocols.psp import PartialPush
from pserver.protocols.rudra import Hardsync


def test_fraction_of_blocks_then_compute_at_once() -> None:
    pp = PartialPull(n_blocks=10, fraction=0.9, tau2=0.0)
    pp.start(0.0, wanted=1)
    for b in range(8):
        assert pp.on_block(b, 1, now=0.1 * b)
        assert not pp.ready(100.0)
        assert pp.deadline() is None
    assert pp.on_block(9, 2, now=1.0)  # newer than required is fine
    assert pp.ready(1.0) and pp.deadline() == 1.0
    assert pp.missing() == {8}
    assert pp.stale_fraction == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("n", "fraction", "need"),
    [
        (100, 0.07, 7),  # 0.07 * 100 = 7.000000000000001: a bare ceil() would ask for 8
        (100, 0.57, 57),  # 0.57 * 100 = 56.99999999999999
        (10, 0.75, 8),
        (10, 0.9, 9),
        (4, 0.75, 3),
        (3, 0.1, 1),
        (5, 1.0, 5),
    ],
)
def test_blocks_needed(n: int, fraction: float, need: int) -> None:
    pp = PartialPull(n, fraction, 0.0)
    pp.start(0.0, wanted=0)
    assert pp.need == need
    for b in range(need - 1):
        pp.on_block(b, 0, 0.0)
    assert not pp.ready(0.0)
    pp.on_block(need - 1, 0, 0.0)
    assert pp.ready(0.0)


def test_timeout_after_b_blocks_has_an_exact_deadline() -> None:
    pp = PartialPull(n_blocks=4, fraction=0.5, tau2=0.25)
    pp.start(5.0, wanted={0: 3, 1: 3, 2: 3, 3: 3})
    pp.on_block(2, 3, now=5.5)
    assert pp.deadline() is None
    pp.on_block(0, 3, now=6.0)
    assert pp.deadline() == 6.25  # the timer starts at the b-th block
    assert not pp.ready(6.2499) and pp.ready(6.25)
    pp.on_block(3, 4, now=6.1)  # a third block does not restart it
    assert pp.deadline() == 6.25 and not pp.ready(6.2)
    assert pp.missing() == {1} and pp.stale_fraction == 0.25


def test_all_blocks_close_before_the_timeout() -> None:
    pp = PartialPull(n_blocks=3, fraction=0.5, tau2=30.0)
    pp.start(0.0, wanted=0)
    for now, b in enumerate((1, 0, 2)):
        pp.on_block(b, 0, now=float(now))
    assert pp.ready(2.0) and pp.deadline() == 31.0  # 2 of 3 at t = 1.0
    assert pp.missing() == set() and pp.stale_fraction == 0.0


def test_late_block_is_missing_then_used_next_iteration() -> None:
    # Rudra-style requirement: each block newer than the copy the last gradient came from.
    pp = PartialPull(n_blocks=4, fraction=0.75, tau2=0.0)
    have = {b: 0 for b in range(4)}
    pp.start(0.0, {b: have[b] + 1 for b in have})
    for b in (0, 1, 3):
        assert pp.on_block(b, 1, now=1.0)
        have[b] = 1
    assert pp.ready(1.0) and pp.missing() == {2}  # block 2's server is slow: compute without it
    # Iteration 1: block 2 still wants > 0 (its copy is still w^0); the others want > 1.
    pp.start(2.0, {b: have[b] + 1 for b in have})
    assert pp.wanted == {0: 2, 1: 2, 2: 1, 3: 2} and pp.iteration == 1
    assert pp.on_block(2, 1, now=2.1)  # the late reply of iteration 0, fresh enough now
    assert pp.missing() == {0, 1, 3}
    for b in (0, 1):
        assert pp.on_block(b, 2, now=2.5)
    assert pp.ready(2.5) and pp.missing() == {3}


def test_block_older_than_required_is_dropped() -> None:
    # Algorithm 1 verbatim: iteration t accepts only blocks with t' >= t (lines 10-11).
    pp = PartialPull(n_blocks=3, fraction=1.0, tau2=0.0)
    pp.start(0.0, wanted=2)
    assert not pp.on_block(1, 1, now=0.1)  # a late reply from iteration 1: dropped
    assert pp.dropped == 1 and pp.missing() == {0, 1, 2} and not pp.ready(1e9)
    assert pp.on_block(0, 2, now=0.2) and pp.on_block(2, 2, now=0.3)
    assert not pp.ready(1e9)  # fraction 1 waits for block 1 ...
    assert pp.on_block(1, 2, now=0.4)  # ... asked again, it comes back fresh
    assert pp.ready(0.4) and pp.stale_fraction == 0.0


def test_repeated_reply_counts_once() -> None:
    pp = PartialPull(n_blocks=2, fraction=1.0, tau2=0.0)
    pp.start(0.0, wanted=0)
    assert pp.on_block(0, 0, 0.0) and pp.on_block(0, 1, 0.1)
    assert not pp.ready(0.1) and pp.used == {0: 1}


def test_only_wanted_blocks_count() -> None:
    # Blocks 1 and 3 have stopped: the fraction is of the two blocks still waited for.
    pp = PartialPull(n_blocks=4, fraction=0.5, tau2=0.0)
    pp.start(0.0, {0: 5, 2: 5})
    assert pp.need == 1
    assert not pp.on_block(3, 9, 0.0)  # not waited for: ignored
    assert not pp.ready(0.0)
    assert pp.on_block(2, 5, 0.0)
    assert pp.ready(0.0) and pp.missing() == {0} and pp.stale_fraction == 0.5
    pp.start(1.0, {})
    assert pp.ready(1.0) and pp.stale_fraction == 0.0  # nothing left to wait for


def test_misuse() -> None:
    pp = PartialPull(n_blocks=2, fraction=0.5, tau2=0.0)
    with pytest.raises(RuntimeError, match="start"):
        pp.on_block(0, 0, 0.0)
    with pytest.raises(ValueError, match="out of range"):
        pp.start(0.0, {2: 0})
    pp.start(0.0, wanted=0)
    with pytest.raises(ValueError, match="out of range"):
        pp.on_block(-1, 0, 0.0)


@pytest.mark.parametrize(
    ("n", "fraction", "tau2", "match"),
    [
        (0, 0.5, 0.0, "at least one block"),
        (2, 0.0, 0.0, "fraction"),
        (2, 1.5, 0.0, "fraction"),
        (2, 0.5, -1.0, "tau2"),
        (2, 0.5, math.nan, "tau2"),
    ],
)
def test_bad_parameters(n: int, fraction: float, tau2: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PartialPull(n, fraction, tau2)


# -- the pull rules (protocol.pull_timestamp) ---------------------------------------------------


def test_stop_takes_a_block_out_of_the_iteration() -> None:
    # 3 of 4 needed; block 1 answers STOP: 3 of the 3 left are needed, and the two in suffice
    # once block 3 comes; a block that stopped must never be waited for (liveness, A4).
    pp = PartialPull(n_blocks=4, fraction=0.75, tau2=0.0)
    pp.start(0.0, wanted=5)
    assert pp.on_block(0, 5, 0.1) and pp.on_block(2, 5, 0.2)
    assert not pp.ready(1e9) and pp.need == 3
    pp.forget(1, 0.3)
    assert pp.need == 3 and pp.wanted.keys() == {0, 2, 3} and not pp.ready(1e9)
    pp.forget(3, 0.4)  # the other one stops too: the two in are all that is left
    assert pp.need == 2 and pp.ready(0.4) and pp.missing() == set()
    pp.forget(3, 0.5)  # a repeated STOP is harmless


def test_block_rule_asks_for_newer_than_the_copy() -> None:
    rule = PullRule(BLOCK, waits_for_update=True)
    assert rule.oldest(7) == 8 and rule.push_iteration() is None
    rule.pulled({0: 9, 1: 3})
    assert rule.oldest(3) == 4 and rule.push_iteration() is None
    assert PullRule(BLOCK, waits_for_update=False).oldest(7) == 0  # async: anything goes


def test_iteration_rule_tags_every_push_of_an_iteration_alike() -> None:
    rule = PullRule(ITERATION, waits_for_update=True)
    assert rule.push_iteration() == 0  # the first minibatch runs on w0
    assert rule.oldest(0) == rule.oldest(5) == 1  # the same requirement for every block
    rule.pulled({0: 1, 1: 1, 2: 0, 3: 1})  # block 2 kept its w0 copy: still iteration 1
    assert rule.push_iteration() == 1 and rule.oldest(0) == 2
    rule.pulled({0: 2, 1: 2, 2: 1, 3: 2})
    assert rule.push_iteration() == 2


def test_iteration_rule_catches_a_straggler_up_but_never_past_a_block() -> None:
    # Under c < λ the blocks moved on to 9 and 12 while this learner was at iteration 3: its
    # tag jumps to the oldest block it holds, so its gradients count again, and no push is
    # ever tagged past the block it goes to (assumption A2 of the liveness proof).
    rule = PullRule(ITERATION, waits_for_update=True)
    rule.tag = 3
    have = {0: 9, 1: 12}
    rule.pulled(have)
    assert rule.push_iteration() == 9 <= min(have.values())
    assert rule.oldest(12) == 10
    rule.pulled({})  # every block stopped: nothing to tag
    assert rule.push_iteration() == 9


def test_pull_rule_misuse() -> None:
    with pytest.raises(ValueError, match="pull rule"):
        PullRule("auto", waits_for_update=True)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "block"),
        (["protocol.pull_fraction=0.5", "blocks.count=2"], "iteration"),
        (["protocol.name=psp", "protocol.pull_fraction=0.75", "blocks.count=4"], "iteration"),
        (["protocol.name=psp"], "block"),
        (["protocol.name=async", "protocol.pull_fraction=0.5", "blocks.count=2"], "block"),
        (["protocol.name=ssp", "protocol.pull_fraction=0.5", "blocks.count=2"], "block"),
        (["protocol.pull_timestamp=iteration"], "iteration"),
        (["protocol.name=psp", "protocol.pull_timestamp=block"], "block"),
    ],
)
def test_auto_takes_the_iteration_rule_with_partial_pulling(overrides, expected) -> None:
    assert pull_timestamp(load_config(None, overrides)) == expected


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["protocol.pull_fraction=0.75", "protocol.pull_timestamp=block"], "can deadlock"),
        (
            ["protocol.name=psp", "protocol.pull_fraction=0.5", "protocol.pull_timestamp=block"],
            "can deadlock under psp",
        ),
        (["protocol.name=async", "protocol.pull_timestamp=iteration"], "hardsync and psp only"),
        (["protocol.name=ssp", "protocol.pull_timestamp=iteration"], "hardsync and psp only"),
        (["cluster.tree_fanout=2", "protocol.pull_timestamp=iteration"], "tree_fanout = 0"),
        (["comm.mode=thread", "protocol.pull_timestamp=iteration"], 'comm.mode = "blocking"'),
        (
            [
                "comm.mode=nonblocking",
                "cluster.bcast_fanout=2",
                "protocol.pull_timestamp=iteration",
            ],
            'comm.mode = "blocking"',
        ),
        (["protocol.pull_timestamp=sometimes"], "expected one of auto, iteration, block"),
    ],
)
def test_pull_rules_that_can_hang_are_refused(overrides, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


# -- whole runs of learners and blocks, in one process ------------------------------------------


class Sim:
    """Learners and blocks exchanging pushes and pulls with random latencies (no MPI).

    It drives the real PartialPull, PullRule and protocol objects the way roles/learner.py
    and roles/server.py do: per-pair FIFO channels (MPI's non-overtaking order), pulls held
    until the block reaches the timestamp asked for, injected reply delays, replies that land
    during a compute judged at the next pull, a block done after ``rounds`` updates answering
    STOP. ``run()`` returns True when every learner finished, False when nothing is left to
    happen but some learner still waits: a deadlock.
    """

    def __init__(self, *, rule, learners, blocks, c, fraction, rounds, seed, delay_prob):
        self.rng = random.Random(seed)
        self.queue: list = []
        self.seq = itertools.count()
        self.now = 0.0
        self.fifo: dict = {}
        self.delay_prob = delay_prob
        self.rounds = rounds
        self.commits: list[int] = []
        make = (lambda: Hardsync(learners, 16, 16)) if c == learners else (
            lambda: PartialPush(learners, c, 0.0)
        )
        self.blocks = [
            {"ts": 0, "proto": make(), "held": [], "done": False} for _ in range(blocks)
        ]
        self.learners = [
            {
                "have": dict.fromkeys(range(blocks), 0),
                "stopped": set(),
                "asked": set(),
                "mail": [],
                "pulling": False,
                "finished": False,
                "pull": PartialPull(blocks, fraction, 0.0),
                "rule": PullRule(rule, waits_for_update=True),
            }
            for _ in range(learners)
        ]

    def at(self, t, fn, *args):
        heapq.heappush(self.queue, (t, next(self.seq), fn, args))

    def send(self, pair, fn, *args, extra=0.0):
        t = max(self.now + self.rng.uniform(0.001, 0.01) + extra, self.fifo.get(pair, 0.0))
        self.fifo[pair] = t
        self.at(t, fn, *args)

    def run(self) -> bool:
        for k in range(len(self.learners)):
            self.at(self.rng.uniform(0.0, 0.01), self.computed, k)
        while self.queue:
            self.now, _, fn, args = heapq.heappop(self.queue)
            fn(*args)
        return all(lr["finished"] for lr in self.learners)

    # learners
    def computed(self, k):
        lr = self.learners[k]
        it = lr["rule"].push_iteration()
        for b in range(len(self.blocks)):
            if b not in lr["stopped"]:
                self.send(("up", k, b), self.on_push, b, k, lr["have"][b], it)
                if b not in lr["asked"]:
                    self.ask(k, b)
        live = {b: 0 for b in range(len(self.blocks)) if b not in lr["stopped"]}
        lr["pull"].start(self.now, {b: lr["rule"].oldest(lr["have"][b]) for b in live})
        lr["pulling"] = True
        mail, lr["mail"] = lr["mail"], []
        for reply in mail:
            self.judge(k, *reply)
        self.maybe_compute(k)

    def ask(self, k, b):
        lr = self.learners[k]
        lr["asked"].add(b)
        oldest = lr["rule"].oldest(lr["have"][b])
        self.send(("up", k, b), self.on_pull, b, k, lr["have"][b], oldest)

    def on_reply(self, k, b, kind, ts):
        lr = self.learners[k]
        if lr["pulling"]:
            self.judge(k, b, kind, ts)
            self.maybe_compute(k)
        else:
            lr["mail"].append((b, kind, ts))

    def judge(self, k, b, kind, ts):
        lr = self.learners[k]
        lr["asked"].discard(b)
        if kind == "stop":
            lr["stopped"].add(b)
            lr["pull"].forget(b, self.now)
        elif lr["pull"].on_block(b, ts, self.now):
            lr["have"][b] = max(lr["have"][b], ts)
        else:
            self.ask(k, b)

    def maybe_compute(self, k):
        lr = self.learners[k]
        if lr["asked"] and not lr["pull"].ready(self.now):
            return
        lr["pulling"] = False
        live = {b: ts for b, ts in lr["have"].items() if b not in lr["stopped"]}
        lr["rule"].pulled(live)
        if not live:
            lr["finished"] = True
            return
        self.at(self.now + self.rng.uniform(0.005, 0.02), self.computed, k)

    # blocks
    def on_push(self, b, k, have, it):
        st = self.blocks[b]
        if st["done"]:
            return
        st["proto"].on_gradient(Arrival(k, have, self.now, it), st["ts"])
        if st["proto"].ready(self.now):
            self.commit(b)

    def commit(self, b):
        st = self.blocks[b]
        d = st["proto"].commit(st["ts"])
        self.commits.append(len(d.learners))
        st["ts"] = d.new_timestamp
        st["done"] = st["ts"] >= self.rounds
        held, st["held"] = st["held"], []
        for pull in held:
            self.answer(b, *pull)

    def on_pull(self, b, k, have, oldest):
        if self.rng.random() < self.delay_prob:
            self.at(self.now + 0.05, self.answer, b, k, have, oldest)
        else:
            self.answer(b, k, have, oldest)

    def answer(self, b, k, have, oldest):
        st = self.blocks[b]
        if st["done"]:
            self.send(("down", b, k), self.on_reply, k, b, "stop", st["ts"])
        elif st["ts"] < oldest:
            st["held"].append((k, have, oldest))
        else:
            kind = "current" if st["ts"] == have else "weights"
            self.send(("down", b, k), self.on_reply, k, b, kind, st["ts"])


def test_block_rule_deadlocks_with_partial_pulling_and_the_iteration_rule_does_not() -> None:
    # The first run in miniature: hardsync, 4 learners, 4 blocks, b = 0.75, delays.
    args = dict(learners=4, blocks=4, c=4, fraction=0.75, rounds=60, delay_prob=0.05)
    block = [Sim(rule=BLOCK, seed=s, **args).run() for s in range(10)]
    assert not any(block)  # the block rule: each of these schedules hangs for good
    for seed in range(10):
        sim = Sim(rule=ITERATION, seed=seed, **args)
        assert sim.run(), seed
        assert min(sim.commits) >= 1


def test_with_whole_pulls_both_rules_take_the_same_rounds() -> None:
    args = dict(learners=4, blocks=4, c=4, fraction=1.0, rounds=30, delay_prob=0.05)
    for seed in range(5):
        block = Sim(rule=BLOCK, seed=seed, **args)
        iteration = Sim(rule=ITERATION, seed=seed, **args)
        assert block.run() and iteration.run()  # the simulator itself does not hang
        assert block.commits == iteration.commits and block.now == iteration.now


@pytest.mark.parametrize(
    ("learners", "blocks", "c", "fraction"),
    [
        (4, 4, 4, 0.75),
        (4, 8, 4, 0.5),
        (3, 5, 2, 0.6),
        (5, 3, 1, 0.34),
        (2, 6, 2, 0.9),
        (4, 4, 3, 1.0),
    ],
)
def test_iteration_rule_always_finishes(learners, blocks, c, fraction) -> None:
    for seed in range(10):
        sim = Sim(
            rule=ITERATION, learners=learners, blocks=blocks, c=c, fraction=fraction,
            rounds=30, seed=seed, delay_prob=0.1,
        )
        assert sim.run(), (seed, [b["ts"] for b in sim.blocks])
        assert min(sim.commits) >= 1 and all(b["done"] for b in sim.blocks)


def test_a_block_that_always_answers_late_still_refreshes_the_copy():
    """Two blocks, b = 1/2, τ2 = 0, iteration rule: block 0's reply arrives in each iteration,
    block 1's reply to that iteration's request lands only after the next iteration began (the
    second block of one shard). Dropping it (PSP-SGD line 11 verbatim) left block 1 at the
    learner's first copy for the whole run; judged against the copy it replaces the copy."""
    pp, rule = PartialPull(n_blocks=2, fraction=0.5, tau2=0.0), PullRule(ITERATION, True)
    have = {0: 0, 1: 0}
    late: int | None = None  # block 1's weights still in flight
    for it in range(20):
        wanted = rule.oldest(have[0])
        pp.start(float(it), {0: wanted, 1: wanted})
        if late is not None:  # the previous iteration's reply: too old for this one
            verdict = pp.judge(1, late, have[1], float(it))
            assert verdict == (REFRESH if late > have[1] else DROP)
            if verdict == REFRESH:
                have[1] = late
        assert pp.judge(0, wanted, have[0], it + 0.5) == USE
        have[0] = wanted
        assert pp.ready(it + 0.5) and pp.missing() == {1}
        rule.pulled(have)
        late = wanted
        assert rule.tag - have[1] <= 2  # the kept copy's age stays bounded
    assert have[1] == 19
    assert pp.judge(1, have[1], have[1], 30.0) == DROP  # not newer than the copy
