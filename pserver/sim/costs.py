"""The cost model of a simulation (``[sim]``, ``pserver.plan.config.SimConfig``) with ``[inject]``.

Every duration is a pure function of the config and of (learner, step) or (shard, learner,
request): draws use the counter-based hash of ``pserver.plan.inject`` (``uniform``), so a
simulation is reproducible from ``run.seed``, needs no random state per learner (100,000
learners cost no generators) and a learner's compute times do not depend on the event order.

* compute of learner k's minibatch s: ``sim.compute`` × a lognormal factor of mean 1 and
  coefficient of variation ``sim.compute_cv``, × ``inject.learner_factor`` for the slow learner
  (the real trainer stretches its real compute so), plus ``inject.compute_time_for`` (the
  emulated compute the real trainer sleeps);
* a message between a learner and its shard: ``sim.latency`` + bytes / ``sim.bandwidth``,
  the latency of a pull's reply drawn lognormal (``sim.latency_cv``) per learner and request;
* the job's start-up before the first minibatch (``sim.start_time``) and its end after the
  last message (``sim.end_time``: the last test, the dump);
* the shard: ``sim.message_time`` per message, plus ``sim.update_per_byte`` × the gradient's
  bytes per push, × ``inject.server_factor`` on the slow shard;
* the data server: ``sim.data_time`` per minibatch, one at a time (a FIFO queue);
* injected pull-reply delays and freezes: ``InjectPlan``'s own draws, the real run's;
* with ``sim.cores`` > 0, the node's cores (``pserver.sim.cores``): a learner's model compute
  (not the emulated compute, which the trainer sleeps) and its step's CPU (:meth:`step_cpu`),
  the shard's handling of a message and the statistics server's ``sim.other_cpu`` per ``train``
  row are CPU jobs of one processor-sharing queue, stretched while more jobs than cores run;
* with ``sim.polls``, a waiting rank's polls: a learner waiting for a pull's reply, or the
  shard for its next message, tests as the real ranks' back-off spaces its tests
  (``pserver.comm.backoff.Backoff``, driven here on a simulated clock: 1/8 of the time waited
  so far, within ``comm.poll_min`` … ``comm.poll_max``, the latter stretched by the ranks per
  core of ``sim.cores``, ``crowded_poll_max``), and sees what arrived at its next test
  (:func:`noticed`).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

from pserver.comm.backoff import MAX_CROWDED_POLL, Backoff
from pserver.plan.config import Config, SimConfig, inject_plan
from pserver.plan.inject import InjectPlan, uniform

COMPUTE_SALT = 0x51D  # keeps the compute draws apart from InjectPlan's delay draws
REPLY_SALT = 0x8E9  # and the reply latencies apart from both


@dataclass(frozen=True)
class Costs:
    sim: SimConfig
    plan: InjectPlan
    batch: int  # samples per minibatch
    nbytes: int  # bytes of the model (a whole pull or push payload)
    seed: int
    poll: tuple[float, float] | None = None  # (shortest, longest sleep) with sim.polls

    @classmethod
    def from_config(cls, cfg: Config, nbytes: int) -> Costs:
        poll = None
        if cfg.sim.polls:
            c = cfg.comm
            ranks = cfg.cluster.learners + cfg.cluster.servers + 2
            crowd = max(ranks / cfg.sim.cores, 1.0) if cfg.sim.cores > 0 else 1.0
            poll = (c.poll_min, min(c.poll_max * crowd, max(c.poll_max, MAX_CROWDED_POLL)))
        return cls(cfg.sim, inject_plan(cfg), cfg.data.batch_size, nbytes, cfg.run.seed, poll)

    def seen(self, waited: float) -> float:
        """Seconds after a wait began that a message arriving ``waited`` seconds into it is seen
        (``waited`` itself without ``sim.polls``)."""
        if self.poll is None:
            return waited
        return noticed(waited, *self.poll)

    def compute(self, learner: int, step: int) -> float:
        """Seconds learner ``learner`` computes minibatch ``step`` (as the trainer times it)."""
        return self.compute_cpu(learner, step) + self.compute_sleep(learner)

    def compute_cpu(self, learner: int, step: int) -> float:
        """The model's part of :meth:`compute`: CPU seconds, shared on ``sim.cores``."""
        s, plan = self.sim, self.plan
        model = s.compute
        if s.compute_cv > 0.0:
            model *= lognormal(s.compute_cv, COMPUTE_SALT, self.seed, learner, step)
        if learner == plan.slow_learner:
            model *= plan.learner_factor
        return model

    def compute_sleep(self, learner: int) -> float:
        """The emulated part of :meth:`compute` (``[inject]``): the trainer sleeps it, the
        cores idle."""
        return self.plan.compute_time_for(learner, self.batch)

    @property
    def shared(self) -> bool:
        """Whether the ranks share ``sim.cores`` processors (``pserver.sim.cores``)."""
        return self.sim.cores > 0.0

    def step_cpu(self) -> float:
        """With ``sim.cores``: a learner's CPU seconds per step besides its compute, run after
        the push: ``step_overhead`` and the rest of ``sim.cpu`` (the exchange's sends, receives
        and polls)."""
        s = self.sim
        rest = max(s.cpu - s.compute - s.step_overhead, 0.0) if s.cpu > 0.0 else 0.0
        return s.step_overhead + rest

    def message(self, payload: bool, nbytes: int | None = None) -> float:
        """Seconds from send to arrival of a header, with ``nbytes`` (the model's when None:
        one block) when ``payload``."""
        s = self.sim
        return s.latency + (self.payload(nbytes) if payload else 0.0)

    def payload(self, nbytes: int | None = None) -> float:
        """Seconds ``nbytes`` (the model's when None) take on a link: bytes / ``bandwidth``."""
        return (self.nbytes if nbytes is None else nbytes) / self.sim.bandwidth

    def reply(self, payload: bool, learner: int, request: int, nbytes: int | None = None) -> float:
        """Seconds a pull's reply travels: ``latency`` (a lognormal draw of that mean when
        ``sim.latency_cv`` > 0, per learner and request) plus ``nbytes`` (the model's when
        None: one block) when ``payload``."""
        s = self.sim
        lat = s.latency
        if s.latency_cv > 0.0:
            lat *= lognormal(s.latency_cv, REPLY_SALT, self.seed, learner, request)
        return lat + (self.payload(nbytes) if payload else 0.0)

    def service(self, shard: int, push: bool, nbytes: int | None = None) -> float:
        """Seconds the shard spends on one message (a push carries a gradient of ``nbytes``,
        the model's when None or 0, to take: its block's)."""
        s = self.sim
        t = s.message_time + (s.update_per_byte * (nbytes or self.nbytes) if push else 0.0)
        return t * self.plan.server_slowdown(shard)


def lognormal(cv: float, *key: int) -> float:
    """A lognormal draw of mean 1 and coefficient of variation ``cv``, a pure function of
    ``key`` (Box-Muller on two hashed uniforms)."""
    var = math.log1p(cv * cv)
    u1 = uniform(*key, 1) or 2.0**-53
    u2 = uniform(*key, 2)
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return math.exp(math.sqrt(var) * z - var / 2.0)


def noticed(arrival: float, lo: float, hi: float) -> float:
    """The first test at or after ``arrival`` s into a wait whose back-off sleeps within ``lo``
    … ``hi``: the real ``pserver.comm.backoff.Backoff``'s schedule (:func:`poll_times`; its
    spinning tests taken as no time), then sleeps of ``hi``. A wait with ``lo`` ≤ 0 tests
    without sleeping: it sees a message as it arrives."""
    if arrival <= 0.0 or lo <= 0.0:
        return max(arrival, 0.0)
    times = poll_times(lo, hi)
    end = times[-1]
    if arrival <= end:
        return times[bisect.bisect_left(times, arrival * (1.0 - 1e-12))]
    return end + math.ceil((arrival - end) / hi - 1e-9) * hi


@functools.lru_cache(maxsize=64)
def poll_times(lo: float, hi: float) -> tuple[float, ...]:
    """When a wait tests, in seconds from its start, until its sleeps reach ``hi``:
    ``Backoff(lo, hi)`` asked for each sleep on a simulated clock (one spinning test, at 0).
    Within one wait the back-off never sleeps less than it last did nor more than ``hi`` (no
    ``long`` ceiling here, as the simulator's waits have none), so past the last time listed
    every sleep is ``hi``."""
    now = [0.0]
    backoff = Backoff(lo, hi, spin=1, clock=lambda: now[0])
    times = [0.0]
    while True:
        sleep = backoff.next_sleep()
        now[0] += sleep
        times.append(now[0])
        if sleep >= hi:
            return tuple(times)
