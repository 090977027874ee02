"""ADPSGD's ring schedule (pserver.protocols.ring), pure: the graph, and a one-process simulator
that
runs every learner's threads under random interleavings (random delays) and asserts that the
run ends (no deadlock), that every goodbye is matched, and that each exchange mixed the models
doubly stochastically (the sum of the models moves by the applied updates only).

A scheduling point is where a thread may be delayed; what runs between two points is atomic,
as the lock of ``pserver.roles.gossip`` makes it. The simulator's threads follow the exchange's
protocol: a sender averages its last exchange in before its next update (Fig. 3b), a receiver's
communication thread answers one request at a time.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Generator

import pytest

from pserver.comm.wire import GossipKind
from pserver.protocols.ring import (
    RECEIVER,
    SENDER,
    Goodbyes,
    GossipError,
    Ring,
    VectorClock,
    age,
    average,
    mean_models,
)  # fmt: skip

EXCHANGE, ANSWER, BYE = GossipKind.EXCHANGE, GossipKind.ANSWER, GossipKind.BYE  # as on the wire
Wait = Callable[[], bool]
Thread = Generator[Wait | None, None, None]


def test_roles_alternate_and_every_edge_is_bipartite():
    for n in range(2, 40):
        ring = Ring(n)
        assert {ring.role(i) for i in range(n)} == {SENDER, RECEIVER}
        for e in ring.edges():
            a, b = sorted(e)
            assert ring.role(a) != ring.role(b), (n, a, b)
        # connected: a path or a ring visits every learner
        seen, todo = {0}, [0]
        while todo:
            for j in ring.neighbours(todo.pop()):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        assert seen == set(range(n))
        assert len(ring.edges()) == (n if n % 2 == 0 and n > 2 else n - 1)


def test_senders_alternate_left_and_right():
    ring = Ring(6)
    assert [ring.partner(2, k) for k in range(4)] == [1, 3, 1, 3]
    assert [ring.partner(0, k) for k in range(2)] == [5, 1]
    odd = Ring(5)
    assert odd.neighbours(0) == (1,) and odd.neighbours(4) == (3,)
    assert [odd.partner(0, k) for k in range(3)] == [1, 1, 1]
    assert Ring(2).neighbours(0) == (1,) and Ring(2).neighbours(1) == (0,)
    with pytest.raises(ValueError):
        ring.partner(1, 0)
    with pytest.raises(ValueError):
        Ring(1)


def test_goodbyes_refuse_requests_after_a_goodbye_and_strangers():
    book = Goodbyes(Ring(4), 1)
    book.request(0)
    book.bye(0)
    assert not book.done
    with pytest.raises(GossipError):
        book.request(0)
    with pytest.raises(GossipError):
        book.request(3)
    with pytest.raises(GossipError):
        book.bye(0)
    book.bye(2)
    assert book.done


def test_vector_clock_and_age():
    c = VectorClock(3, 1)
    c.tick()
    c.tick()
    c.merge([5, 0, 1])
    assert c.steps == [5, 2, 1] and c.own == 2
    assert age(2, 5) == 0 and age(7, 3) == 4 and age(3, 3) == 0


def test_average_and_mean():
    import numpy as np

    w, o = np.array([1.0, 3.0]), np.array([3.0, -1.0])
    average(np, w, o)
    assert w.tolist() == [2.0, 1.0]
    assert mean_models([np.array([1.0]), np.array([3.0])]).tolist() == [2.0]


class NaiveRing(Ring):
    """The full ring even when λ is odd (an edge between two senders): must deadlock."""

    def neighbours(self, i: int) -> tuple[int, ...]:
        n = self.size
        return tuple(dict.fromkeys(((i - 1) % n, (i + 1) % n)))


class Sim:
    """λ learners on ``ring``; learner i takes ``budget[i]`` minibatches."""

    def __init__(self, ring: Ring, budget: list[int], rng: random.Random, atomic: bool = True):
        n = ring.size
        self.ring, self.budget, self.rng, self.atomic = ring, budget, rng, atomic
        self.w = [rng.uniform(-1, 1) for _ in range(n)]
        self.start_sum = sum(self.w)
        self.applied = 0.0
        self.chan: dict[tuple[int, int], deque] = {}
        self.clock = [VectorClock(n, i) for i in range(n)]
        self.books = {i: Goodbyes(ring, i) for i in range(n) if ring.role(i) == RECEIVER}
        self.byes_sent: dict[int, int] = {i: 0 for i in range(n)}
        self.exchanges = 0
        self.threads: list[Thread] = []
        for i in range(n):
            if ring.role(i) == SENDER:
                self.threads.append(self.sender(i))
            else:
                self.main_done = getattr(self, "main_done", {})
                self.main_done[i] = False
                self.threads.append(self.receiver_main(i))
                self.threads.append(self.receiver_comm(i))

    def q(self, a: int, b: int) -> deque:
        return self.chan.setdefault((a, b), deque())

    def answered(self, p: int, i: int) -> bool:
        q = self.q(p, i)
        return bool(q) and q[0][0] == ANSWER  # a sender serves nothing else

    def update(self, i: int) -> None:
        g = self.rng.uniform(-1, 1)
        self.w[i] -= 0.1 * g
        self.applied += 0.1 * g
        self.clock[i].tick()

    def sender(self, i: int) -> Thread:
        pending = None
        for k in range(self.budget[i]):
            yield None  # compute on a snapshot: any delay
            if pending is not None:
                p = pending
                if not self.atomic:  # wrong on purpose: update before averaging in
                    self.update(i)
                yield lambda p=p: self.answered(p, i)
                kind, theirs, clock = self.q(p, i).popleft()
                assert kind == ANSWER
                average(None, _Box(self.w, i), theirs)
                self.clock[i].merge(clock)
                if not self.atomic:
                    pending = None
                    p = self.ring.partner(i, k)
                    self.q(i, p).append((EXCHANGE, self.w[i], list(self.clock[i].steps)))
                    pending = p
                    continue
            self.update(i)
            p = self.ring.partner(i, k)
            self.q(i, p).append((EXCHANGE, self.w[i], list(self.clock[i].steps)))
            pending = p
        if pending is not None:
            p = pending
            yield lambda p=p: self.answered(p, i)
            kind, theirs, clock = self.q(p, i).popleft()
            average(None, _Box(self.w, i), theirs)
            self.clock[i].merge(clock)
        for j in self.ring.neighbours(i):
            self.q(i, j).append((BYE, None, None))
            self.byes_sent[i] += 1

    def receiver_main(self, i: int) -> Thread:
        for _ in range(self.budget[i]):
            yield None  # compute on a snapshot
            self.update(i)  # under the lock: one scheduling step
        self.main_done[i] = True

    def receiver_comm(self, i: int) -> Thread:
        book = self.books[i]
        while not book.done:
            yield lambda: any(self.q(s, i) for s in book.expected)
            ready = [s for s in sorted(book.expected) if self.q(s, i)]
            s = self.rng.choice(ready)  # arrival order across senders is arbitrary
            kind, theirs, clock = self.q(s, i).popleft()
            if kind == BYE:
                book.bye(s)
                continue
            book.request(s)
            mine = self.w[i]  # snapshot and average in one atomic region (the lock)
            self.q(i, s).append((ANSWER, mine, list(self.clock[i].steps)))
            average(None, _Box(self.w, i), theirs)
            self.clock[i].merge(clock)
            self.exchanges += 1
        yield lambda: self.main_done[i]  # leaves after its own last minibatch too

    def run(self, max_steps: int = 200000) -> None:
        live: list[tuple[Thread, Wait | None]] = [(t, None) for t in self.threads]
        for _ in range(max_steps):
            if not live:
                return
            ready = [k for k, (_, cond) in enumerate(live) if cond is None or cond()]
            if not ready:
                raise Deadlock(f"no thread can move; waiting: {len(live)}")
            k = self.rng.choice(ready)
            t, _ = live[k]
            try:
                live[k] = (t, next(t))
            except StopIteration:
                live.pop(k)
        raise AssertionError("the simulation did not end")


class Deadlock(AssertionError):
    pass


class _Box:
    """``average`` on a list element of floats (the simulator's models are scalars)."""

    def __init__(self, w: list[float], i: int) -> None:
        self.w, self.i = w, i

    def __iadd__(self, other: float) -> _Box:
        self.w[self.i] += other
        return self

    def __imul__(self, f: float) -> _Box:
        self.w[self.i] *= f
        return self


def run_sim(n: int, seed: int, ring_cls: type[Ring] = Ring, atomic: bool = True) -> Sim:
    rng = random.Random(seed)
    budget = [rng.choice([0, 1, 2, rng.randint(3, 25)]) for _ in range(n)]
    sim = Sim(ring_cls(n), budget, rng, atomic)
    sim.run()
    return sim


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 11])
def test_random_schedules_end_with_goodbyes_matched_and_the_sum_kept(n):
    for seed in range(150):
        sim = run_sim(n, seed)
        for i, book in sim.books.items():
            assert book.done and book.gone == set(sim.ring.neighbours(i)), (n, seed, i)
        for i in range(n):
            if sim.ring.role(i) == SENDER:
                assert sim.byes_sent[i] == len(sim.ring.neighbours(i))
        assert all(not q for q in sim.chan.values()), (n, seed)  # nothing left undelivered
        # doubly stochastic mixing: averaging keeps the sum, updates move it by what they applied
        assert sum(sim.w) == pytest.approx(sim.start_sum - sim.applied, abs=1e-9), (n, seed)
        # every clock ends at least at each learner's own steps
        assert [sim.clock[i].own for i in range(n)] == sim.budget


@pytest.mark.parametrize("n", [3, 5, 7])
def test_the_full_ring_of_odd_length_deadlocks(n):
    """What the cut edge avoids: two senders that ask each other wait forever."""
    hung = 0
    for seed in range(30):
        try:
            run_sim(n, seed, NaiveRing)
        except Deadlock:
            hung += 1
    assert hung > 0


def test_an_update_between_send_and_average_breaks_the_sum():
    """What the sender's wait before ``apply`` guarantees (Fig. 3b): without it the mix is not
    doubly stochastic and the sum of the models drifts."""
    broken = 0
    for seed in range(50):
        sim = run_sim(4, seed, atomic=False)
        if abs(sum(sim.w) - (sim.start_sum - sim.applied)) > 1e-9:
            broken += 1
    assert broken > 0


def test_one_learners_own_steps_are_the_serial_reference_bit_for_bit():
    """ADPSGD refuses λ = 1 (no neighbour), but its arithmetic without exchanges is the serial
    reference's: the learner's own update (pserver.optim.local_update) at the epoch ``local_epoch``
    gives, over the serial minibatch stream, exactly ``learners.serial.train_serial``'s weights
    (with the quickstart's momentum, weight decay and learning-rate milestones)."""
    import numpy as np

    from learners.data import BatchSampler, load_dataset
    from learners.models import build_model
    from learners.serial import train_serial
    from pserver.optim.local_update import LocalUpdate
    from pserver.plan.config import load_config
    from pserver.protocols.ring import local_epoch

    cfg = load_config(None, ["optim.rule=momentum", "optim.weight_decay=1e-4",
                             "optim.lr_milestones=[1, 2]", "model.kind=mlp", "model.hidden=[8]",
                             "data.batch_size=64"])  # fmt: skip
    data = load_dataset(cfg.data, cfg.run.seed)
    steps = 3 * len(data.y_train) // 64  # three epochs: both milestones passed
    want = train_serial(cfg, data, steps)
    model = build_model(cfg.model, data.n_features, data.n_classes, np)
    w = model.init_params(cfg.run.seed)
    g = np.empty_like(w)
    rule = LocalUpdate(cfg.optim, w.size, np, w.dtype)
    sampler = BatchSampler(len(data.y_train), 64, cfg.run.seed)
    for step in range(steps):
        idx = sampler.next()
        model.loss_grad(w, data.X_train[idx], data.y_train[idx], g)
        rule.step(w, g, local_epoch(step, 1, 64, len(data.y_train)))
    assert np.array_equal(w, want)
