"""SYNC simulated (IBM, Zhang et al., §3, "SYNC"; the real exchange: ``pserver.roles.allreduce``).

Every step each learner takes a minibatch from its prefetcher (``pserver.sim.feed``: the data
server's own ``DataQuota``), computes its gradient (``Costs.compute``), releases the slot and
joins the step's allreduce; the allreduce completes :func:`allreduce_time` seconds after the
last learner has joined, and every learner then applies the average and starts its next step
(after ``sim.step_overhead``). How many steps (``S = ⌈M/λ⌉``) is the real run's plan
(``pserver.protocols.lockstep.RunPlan``), and each gradient's σ is the real learner's
``ModelVersion`` (0 by construction: the gradient was computed on the version it is applied to).
Nothing is computed on parameters.

The dump has the real SYNC dump's rows: ``train`` (one per learner and step; ``push_time`` the
allreduce's wait, as ``SyncExchange.gradient`` measures it), ``exchanges`` (partner −1),
``staleness`` and ``learners``; no ``drift`` rows (they measure parameters) and, as for every
simulated run, no ``test`` rows and no model.

The allreduce's cost (:func:`allreduce_time`) follows MPICH's ``Iallreduce`` for a built-in
sum (``pserver.comm.collectives.Allreducer`` posts one per bucket of ``comm.bucket_mib`` MiB):
recursive doubling for short messages, Rabenseifner's reduce-scatter + allgather (recursive
halving, then doubling) for long ones, with two extra messages folding in the ranks beyond the
largest power of two; each message costs ``sim.latency`` + bytes / ``sim.bandwidth``.
"""

from __future__ import annotations

import math
from typing import Any

from pserver.plan.config import Config
from pserver.protocols.lockstep import LOCKSTEP, DataQuota, ModelVersion, RunPlan
from pserver.sim.costs import Costs
from pserver.sim.feed import Feed
from pserver.sim.learner import NAN, DataServer
from pserver.sim.rows import Rows

SHORT_BYTES = 2048  # MPICH: at most this many bytes go by recursive doubling
MIB = 2**20


def allreduce_time(costs: Costs, n_learners: int, bucket_mib: float) -> float:
    """Seconds of one allreduce of the model's bytes among ``n_learners`` (the module
    docstring: MPICH's algorithms, one bucket after another)."""
    if n_learners < 2:
        return 0.0
    s = costs.sim
    total, size = costs.nbytes, max(1, int(bucket_mib * MIB))
    pof2 = 1 << (n_learners.bit_length() - 1)
    rounds = int(math.log2(pof2))
    fold = 2 if n_learners != pof2 else 0  # the extra ranks' fold-in and the result's way out
    t = 0.0
    for start in range(0, max(total, 1), size):
        nb = min(size, total - start)
        msg = s.latency + nb / s.bandwidth
        if nb <= SHORT_BYTES:
            t += (rounds + fold) * msg
        else:
            t += fold * msg + 2 * rounds * s.latency + 2 * (pof2 - 1) / pof2 * nb / s.bandwidth
    return t


class SyncRun:
    """λ SYNC learners and their data server on ``loop``; ``start()`` then ``loop.run()``."""

    def __init__(self, loop: Any, cfg: Config, costs: Costs, rows: Rows, n: int,
                 train_size: int) -> None:  # fmt: skip
        self.loop, self.costs, self.rows, self.n = loop, costs, rows, n
        self.plan = RunPlan.from_config(cfg, train_size, n)
        total = -(-self.plan.counter.total_samples // self.plan.counter.batch_size)
        self.feed = Feed(DataQuota(LOCKSTEP, total, n), DataServer(cfg.sim.data_time),
                         cfg.data.prefetch, n)  # fmt: skip
        self.reduce = allreduce_time(costs, n, cfg.comm.bucket_mib)
        self.versions = [ModelVersion() for _ in range(n)]  # every learner's copy
        self.step = 0
        self.joined = 0
        self.done_at = [0.0] * n  # when each learner joined this step's allreduce
        self.fetch = [0.0] * n
        self.compute_now = [0.0] * n
        self.minibatches = [0] * n
        self.compute_time = [0.0] * n
        self.wait_time = [0.0] * n
        self.push_time = [0.0] * n
        self.finished_at = [0.0] * n
        self.train = rows.train()
        self.exchanges = rows.exchanges()
        self.sigmas = rows.staleness()
        self.freeze_learner = costs.plan.freeze_learner

    @property
    def updates(self) -> int:
        return self.versions[0].value if self.versions else 0

    def start(self) -> None:
        self.open_feeds()
        self.begin_step()

    def open_feeds(self) -> None:
        """Every learner's prefetcher asks the data server for its first minibatches."""
        now = self.loop.now
        for k in range(self.n):
            self.feed.open(k, now)

    def begin_step(self) -> None:
        """Every learner has the step's weights (``SyncExchange.weights``); none past S."""
        if self.step >= self.plan.steps:
            now = self.loop.now
            self.finished_at = [now] * self.n
            return
        self.joined = 0
        for k in range(self.n):
            self.take(k)

    def take(self, k: int) -> None:
        now = self.loop.now
        ready, ok = self.feed.take(k)
        if not ok:  # not reached: the quota serves each learner its S steps
            raise RuntimeError(f"learner {k}: the data server stopped before step {self.step}")
        begin = max(now, ready)
        c = self.costs.compute(k, self.step)
        self.fetch[k] = begin - now
        self.compute_now[k] = c
        self.loop.after(begin - now + c, self.computed, k)

    def computed(self, k: int) -> None:
        """Learner ``k``'s gradient is ready: it releases its slot and joins the allreduce."""
        now = self.loop.now
        self.done_at[k] = now
        self.feed.release(k, now)
        self.joined += 1
        if self.joined == self.n:
            self.loop.after(self.reduce, self.reduced)

    def reduced(self) -> None:
        """The sum is in on every learner: each applies it (σ from its ``ModelVersion``)."""
        now, step = self.loop.now, self.step
        nbytes = self.costs.nbytes
        overhead = self.costs.sim.step_overhead
        later = 0.0
        for k in range(self.n):
            v = self.versions[k]
            computed_at = v.value
            sigma = v.applied(computed_at)
            waited = now - self.done_at[k]
            c = self.compute_now[k]
            self.compute_time[k] += c
            self.wait_time[k] += self.fetch[k] + waited
            self.push_time[k] += waited
            self.minibatches[k] += 1
            self.train.append((k, step, now, NAN, NAN, c, self.fetch[k] + waited, 0.0, waited,
                               0.0, 0))  # fmt: skip
            self.exchanges.append((k, step, -1, -1, -1, nbytes, waited, now))
            self.sigmas.append((k, k, computed_at, sigma, now))
            if k == self.freeze_learner:  # inject.freeze_*: after the exchange, as the trainer
                later = max(later, self.costs.plan.freeze_for(k, step))
        for t in (self.train, self.exchanges, self.sigmas):
            self.rows.check(t)
        self.step += 1
        self.loop.after(later + overhead, self.begin_step)

    def end_rows(self, end: float) -> None:
        """The ``learners`` rows (``Trainer``'s totals)."""
        b = self.costs.batch
        for k in range(self.n):
            busy = self.compute_time[k] + self.wait_time[k]
            self.rows.add("learners", learner=k, minibatches=self.minibatches[k],
                          compute_time=self.compute_time[k], wait_time=self.wait_time[k],
                          samples=self.minibatches[k] * b, pull_time=0.0,
                          push_time=self.push_time[k],
                          overlap=self.compute_time[k] / max(busy, 1e-12), relayed_bytes=0,
                          cpu_time=self.compute_time[k], run_time=end)  # fmt: skip


class HybridRun(SyncRun):
    """HYBRID (IBM §3; the real exchange ``pserver.roles.hybrid``): SYNC's allreduce, one step
    late. Learner i's step k computes g_k, then waits for the allreduce of g_{k-1} (in flight
    while g_k was computed), applies it (σ from its ``ModelVersion``: g_k was computed before
    it landed, so σ = 1 but for g_0) and joins the allreduce of g_k; after its last step it
    lands the last one (``HybridExchange.done``). Allreduce k completes ``allreduce_time``
    after the last learner joined it."""

    def __init__(self, loop: Any, cfg: Config, costs: Costs, rows: Rows, n: int,
                 train_size: int) -> None:  # fmt: skip
        super().__init__(loop, cfg, costs, rows, n, train_size)
        self.steps_of = [0] * n  # each learner's next step
        self.flight_version = [0] * n  # the version its gradient in flight was computed on
        self.ended: dict[int, float] = {}  # allreduce k -> when it completed
        self.held: dict[int, list[tuple[int, int]]] = {}  # allreduce k -> (learner, computed_at)
        self.join_count: dict[int, int] = {}

    def start(self) -> None:
        self.open_feeds()
        for k in range(self.n):
            self.begin(k)

    def begin(self, k: int) -> None:
        step = self.steps_of[k]
        if step >= self.plan.steps:  # HybridExchange.done: the last gradient lands
            self.done_at[k] = self.loop.now
            self.after_landing(k, step - 1, None)
            return
        now = self.loop.now
        ready, ok = self.feed.take(k)
        if not ok:
            raise RuntimeError(f"learner {k}: the data server stopped before step {step}")
        begin = max(now, ready)
        self.fetch[k] = begin - now
        self.compute_now[k] = self.costs.compute(k, step)
        self.loop.after(self.fetch[k] + self.compute_now[k], self.computed, k)

    def computed(self, k: int) -> None:
        now = self.loop.now
        self.done_at[k] = now
        self.feed.release(k, now)
        step = self.steps_of[k]
        computed_at = self.versions[k].value  # before the previous average lands
        if step == 0:
            self.joined_allreduce(k, step, computed_at, 0.0)
        else:
            self.after_landing(k, step - 1, computed_at)

    def after_landing(self, k: int, prev: int, computed_at: int | None) -> None:
        """Wait for allreduce ``prev`` (if not in), land it, then go on."""
        if prev < 0:
            self.finish(k)
            return
        if prev in self.ended:
            self.land(k, prev, computed_at)
        else:
            self.held.setdefault(prev, []).append((k, -1 if computed_at is None else computed_at))

    def land(self, k: int, prev: int, computed_at: int | None) -> None:
        now = self.loop.now
        waited = now - self.done_at[k]
        v = self.versions[k]
        flight = self.flight_version[k]
        sigma = v.applied(flight)
        self.exchanges.append((k, prev, -1, -1, -1, self.costs.nbytes, waited, now))
        self.sigmas.append((k, k, flight, sigma, now))
        for t in (self.exchanges, self.sigmas):
            self.rows.check(t)
        if computed_at is None:  # the last landing, after the last step
            self.finish(k)
            return
        self.joined_allreduce(k, self.steps_of[k], computed_at, waited)

    def joined_allreduce(self, k: int, step: int, computed_at: int, waited: float) -> None:
        now = self.loop.now
        self.flight_version[k] = computed_at
        count = self.join_count.get(step, 0) + 1
        self.join_count[step] = count
        if count == self.n:
            del self.join_count[step]
            self.loop.after(self.reduce, self.reduced_step, step)
        c = self.compute_now[k]
        self.compute_time[k] += c
        self.wait_time[k] += self.fetch[k] + waited
        self.push_time[k] += waited
        self.minibatches[k] += 1
        self.train.append((k, step, now, NAN, NAN, c, self.fetch[k] + waited, 0.0, waited,
                           0.0, 0))  # fmt: skip
        self.rows.check(self.train)
        freeze = 0.0
        if k == self.freeze_learner:  # inject.freeze_*: after the exchange, as the trainer
            freeze = self.costs.plan.freeze_for(k, step)
        self.steps_of[k] += 1
        self.loop.after(freeze + self.costs.sim.step_overhead, self.begin, k)

    def reduced_step(self, step: int) -> None:
        self.ended[step] = self.loop.now
        self.ended.pop(step - 2, None)  # no learner waits for it any more
        for k, computed_at in self.held.pop(step, []):
            self.land(k, step, None if computed_at < 0 else computed_at)

    def finish(self, k: int) -> None:
        self.finished_at[k] = self.loop.now
