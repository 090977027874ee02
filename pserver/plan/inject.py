"""Deterministic straggler and delay injection, for experiments like PSP-SGD §4.2.

The paper delays 0.16 % of the pull responses by 4 s to make some servers stragglers. An
:class:`InjectPlan` reproduces that kind of experiment exactly from a seed: whether a given
pull reply is delayed depends only on ``(seed, server, learner, request_index)``, not on the
order in which ranks ask, so every rank can decide its own delays with no communication and a
rerun with the same seed delays the same replies.

The draw is a counter-based hash (SplitMix64's finalizer, applied to each coordinate in turn)
rather than ``numpy.random.default_rng(key)``: seeding a Generator costs tens of microseconds,
the hash about a microsecond, and it passes the same statistical checks at this use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pserver.errors import ConfigError

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: 2^64 / golden ratio
TWO_M53 = 2.0**-53


def mix64(x: int) -> int:
    """SplitMix64's finalizer: a bijection on 64-bit words with full avalanche."""
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(*key: int) -> float:
    """A float in [0, 1) that is a pure function of the integers ``key`` (negatives allowed)."""
    h = 0
    for k in key:
        h = mix64(h ^ (k & MASK64))  # chaining makes the order of the coordinates matter
    return (h >> 11) * TWO_M53


@dataclass(frozen=True)
class InjectPlan:
    """Who is slowed down, and by how much (defaults: nobody, nothing).

    * ``pull_delay_prob``, ``pull_delay``: each pull reply independently waits ``pull_delay``
      seconds more with probability ``pull_delay_prob`` (the paper: 0.0016 and 4 s).
    * ``slow_server``, ``server_factor``: shard ``slow_server`` runs ``server_factor`` times
      slower (-1: none); the driver stretches its handling time by this factor.
    * ``slow_learner``, ``learner_factor``: learner ``slow_learner`` computes ``learner_factor``
      times longer (-1: none).
    * ``compute_time``: seconds of emulated compute per minibatch (an idle accelerator).
    * ``compute_per_sample``: seconds more per sample of the minibatch, so that emulated compute
      grows with the minibatch size μ as GEMM time does on Rudra's learners (§V-B).
    * ``freeze_learner``, ``freeze_step``, ``freeze_time``: learner ``freeze_learner`` sleeps
      ``freeze_time`` seconds in minibatch ``freeze_step`` while a pull of it is out (blocking:
      after its push and pull request; overlapped: after posting its long poll, before the
      compute), without calling MPI: for MPI progress the same as a ``SIGSTOP``ped process
      whose weights are on their way (the case a shard must not wait for).
    """

    seed: int = 0
    pull_delay_prob: float = 0.0
    pull_delay: float = 0.0
    slow_server: int = -1
    server_factor: float = 1.0
    slow_learner: int = -1
    learner_factor: float = 1.0
    compute_time: float = 0.0
    freeze_learner: int = -1
    freeze_step: int = 0
    freeze_time: float = 0.0
    compute_per_sample: float = 0.0

    def pull_delay_for(self, server: int, learner: int, request_index: int) -> float:
        """Extra seconds before ``server`` answers ``learner``'s ``request_index``-th pull."""
        if self.pull_delay_prob <= 0.0 or self.pull_delay <= 0.0:
            return 0.0  # the common case costs no hashing
        u = uniform(self.seed, server, learner, request_index)
        return self.pull_delay if u < self.pull_delay_prob else 0.0

    def compute_time_for(self, learner: int, samples: int = 0) -> float:
        """Emulated compute seconds of a minibatch of ``samples`` samples of ``learner``."""
        factor = self.learner_factor if learner == self.slow_learner else 1.0
        return (self.compute_time + self.compute_per_sample * samples) * factor

    def freeze_for(self, learner: int, step: int) -> float:
        """Seconds ``learner`` stops after the push of minibatch ``step`` (usually 0)."""
        hit = learner == self.freeze_learner and step == self.freeze_step
        return self.freeze_time if hit else 0.0

    def server_slowdown(self, server: int) -> float:
        """Factor (>= 1) on ``server``'s handling time."""
        return self.server_factor if server == self.slow_server else 1.0

    def validate(self, n_servers: int | None = None, n_learners: int | None = None) -> None:
        """Raise :class:`ConfigError` naming the first bad field; check ranks when counts given."""
        for f in fields(self):
            value = getattr(self, f.name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if f.type == "int" and not (number and isinstance(value, int)):
                raise ConfigError(f"inject.{f.name} = {value!r}: expected an integer")
            if f.type == "float" and not (number and math.isfinite(value)):
                raise ConfigError(f"inject.{f.name} = {value!r}: expected a finite number")
        if not 0.0 <= self.pull_delay_prob <= 1.0:
            raise ConfigError(
                f"inject.pull_delay_prob = {self.pull_delay_prob!r}: expected a probability"
                " in [0, 1]"
            )
        for name in ("pull_delay", "compute_time", "freeze_time", "compute_per_sample"):
            if getattr(self, name) < 0.0:
                raise ConfigError(f"inject.{name} = {getattr(self, name)!r}: expected seconds >= 0")
        for name in ("server_factor", "learner_factor"):
            if getattr(self, name) < 1.0:
                raise ConfigError(
                    f"inject.{name} = {getattr(self, name)!r}: expected a slow-down factor >= 1"
                )
        self.check_index("slow_server", self.slow_server, n_servers, "servers")
        self.check_index("slow_learner", self.slow_learner, n_learners, "learners")
        self.check_index("freeze_learner", self.freeze_learner, n_learners, "learners")
        if self.freeze_step < 0:
            raise ConfigError(f"inject.freeze_step = {self.freeze_step!r}: expected a step >= 0")

    @staticmethod
    def check_index(name: str, value: int, count: int | None, what: str) -> None:
        if value < -1 or (count is not None and value >= count):
            some = "an index >= 0" if count is None else f"one of {what} 0..{count - 1}"
            raise ConfigError(f"inject.{name} = {value!r}: expected -1 (none) or {some}")
