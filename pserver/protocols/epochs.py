"""Epochs and termination as pure decisions: counted samples, epoch ends, when to stop.

A shard counts the samples that its updates consumed and decides, after each update (or, under
``run.epoch_basis = "computed"``, after each dropped gradient too):

- which epochs ended (epoch ``e`` ends once ``e · train_size`` samples are counted);
- which of them the statistics server tests: every ``stats.test_every``-th, and every epoch that
  ends in the call that reaches the last sample (the final model is always tested);
- whether training is over: ``run.epochs · train_size`` samples are counted, after which every
  pull is answered STOP.

``run.epoch_basis = "applied"`` counts the gradients that entered updates (Rudra: the server
trains the given epochs); ``"computed"`` also counts those the protocol dropped, i.e. passes of
the learners over the data (PSP-SGD's epochs under partial pushing).

The same count ends a learners-only run (no shard): the data server, which serves every
minibatch from one seeded stream, stops after the last one (``last_minibatch``).

Pure: no MPI, no arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pserver.plan.config import Config

BASES = ("applied", "computed")


@dataclass(frozen=True)
class EpochEnds:
    """What one call of ``EpochCounter.advance`` decided."""

    ended: tuple[int, ...] = ()  # epochs (1-based) that ended, in order
    tested: tuple[int, ...] = ()  # those whose model goes to the statistics server
    done: bool = False  # training is over: the last sample is counted


@dataclass
class EpochCounter:
    """The epoch accounting of one block (or of the data server of a learners-only run)."""

    train_size: int  # samples in one epoch
    batch_size: int  # samples per gradient
    epochs: int  # ``run.epochs``
    test_every: int = 1  # ``stats.test_every``
    basis: str = "applied"  # ``run.epoch_basis``
    next_epoch: int = field(default=1, init=False)  # the first epoch not yet ended

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise ValueError(f"epoch basis {self.basis!r}: expected one of {BASES}")

    @classmethod
    def from_config(cls, cfg: Config, train_size: int) -> EpochCounter:
        return cls(
            train_size, cfg.data.batch_size, cfg.run.epochs, cfg.stats.test_every,
            cfg.run.epoch_basis,
        )  # fmt: skip

    @property
    def total_samples(self) -> int:
        return self.epochs * self.train_size

    @property
    def counts_drops(self) -> bool:
        """Whether a dropped gradient consumed samples of the epoch (``"computed"``)."""
        return self.basis == "computed"

    def samples(self, applied: int, dropped: int = 0) -> int:
        """Samples counted towards the epochs, from the gradients applied and dropped so far."""
        return (applied + (dropped if self.counts_drops else 0)) * self.batch_size

    def position(self, applied: int, dropped: int = 0) -> float:
        """Where the next gradients are, in (0-based, fractional) epochs: the learning-rate
        schedule's, whose warm-up moves within an epoch (``pserver.optim.rules.scheduled_lr``)."""
        return self.samples(applied, dropped) / self.train_size

    def epoch(self, applied: int, dropped: int = 0) -> int:
        """The (0-based) epoch the next gradients belong to: the learning-rate schedule's."""
        return self.samples(applied, dropped) // self.train_size

    def advance(self, applied: int, dropped: int = 0) -> EpochEnds:
        """The epochs that ended since the last call, those tested, and whether it is over."""
        samples = self.samples(applied, dropped)
        done = samples >= self.total_samples
        ended = []
        while samples >= self.next_epoch * self.train_size:
            ended.append(self.next_epoch)
            self.next_epoch += 1
        tested = tuple(e for e in ended if done or e % self.test_every == 0)
        return EpochEnds(tuple(ended), tested, done)

    def last_minibatch(self, served: int) -> bool:
        """Whether ``served`` minibatches complete the run (learners-only: no shard counts)."""
        return served * self.batch_size >= self.total_samples
