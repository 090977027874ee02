"""The learner exchange's interface: everything the trainer (``pserver.roles.trainer``) calls.

An exchange decides what happens to a learner's weights and gradients (``Strategy.exchanges``
names one per ``comm.mode``; ``pserver.job.cli`` builds it): pull and push to shards, an
allreduce, a gossip average. The trainer calls only what is declared here, never probing
for a method: what every exchange must do is abstract, what only some do has its no-op here.

Required: ``weights()`` the model to compute the next minibatch on (None once the run is
over), ``gradient_buffer()`` the array the gradient is computed into, ``gradient(g)`` takes
it, ``staleness()`` the (mean, max) σ of the last step for the progress line, ``done()``
drains what is still to deliver (the seconds blocked), ``close()`` stops its progress (also
after an error), ``finish()`` says goodbye, and ``state()`` / ``restore(state)`` its own
checkpoint record (``pserver.ckpt``: an exchange that keeps nothing the shards do not hold
returns an empty one).

Optional, with the defaults below: ``attach(records)`` for an exchange that writes rows of
its own (the learners-only ``exchanges`` and ``drift``); ``votes_on_stop`` and
``stop_agreed()`` for the lockstep exchanges, whose learners stop at one boundary they agree
on (``pserver.roles.stop_vote``); ``signalled()`` for one whose finish after a signal is a
cut of its own (ADPSGD's); ``interrupt``, which the trainer sets to its own, for one that may
leave a pull when a stop is asked (partial pulling's iteration rule).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pserver.ckpt.files import State
from pserver.comm.waiting import PeerLog, Waiter
from pserver.roles.snapshots import StatsLink

if TYPE_CHECKING:
    from types import ModuleType

    from mpi4py import MPI

    from pserver.comm.backend import Backend
    from pserver.comm.channels import Channels
    from pserver.comm.shm import SharedWindows
    from pserver.plan.config import Config
    from pserver.plan.topology import Block, Layout
    from pserver.runtime.context import LearnerComm


@dataclass(frozen=True)
class LearnerSide:
    """What a learner's exchange and its parts (``PSLink``, ``Children``, ``LockstepModel``,
    ``GossipModel``, the allreducer, the regroup) read of the run, built once from the context
    by ``pserver.job.cli``: the config, the layout and this rank, the parameter blocks, the
    training set's size, the model's bytes, the backend, the channels, the waits' peer log, the
    log, the shared windows (``comm.transport = "shm"``), the learners' communicator (its
    holder: ADPSGD's ring repair replaces it), whether this rank resumes from a checkpoint
    (its state reaches the exchange through ``restore``), the run's clock and a new Waiter.
    Not the dataset, the model, the checkpoint's state, the nodes or the run directory."""

    cfg: Config
    layout: Layout
    rank: int
    blocks: tuple[Block, ...]
    train_size: int
    model_bytes: int  # the whole model's parameters (the snapshot queue's depth)
    backend: Backend
    channels: Channels
    peers: PeerLog
    log: logging.Logger
    shm: SharedWindows | None
    learners: LearnerComm
    resumed: bool
    now: Callable[[], float]  # seconds since the common start
    waiter: Callable[[], Waiter]  # a new Waiter with the run's back-off

    @property
    def xp(self) -> ModuleType:
        return self.backend.xp

    @property
    def learner_comm(self) -> MPI.Comm | None:
        return self.learners.comm

    def stats_link(self) -> StatsLink:
        """Where this learner's model snapshots go (``ModelReport``)."""
        return StatsLink(
            self.channels.stats, self.layout.stats, self.rank, self.cfg.run.epochs, self.backend
        )


class Exchange(ABC):
    """Base of every learner exchange (see the module docstring)."""

    waiter: Waiter  # its waits, counted in the ``learners`` row's wait_time
    have: dict[int, int]  # timestamp of each block held (for the divergence report)
    relayed_bytes: int = 0  # weights this learner forwarded to others (a broadcast tree)
    freeze_after_weights: bool = False  # inject.freeze_*: after weights() or after gradient()
    #: a lockstep exchange: every learner stops at the boundary ``stop_agreed()`` agrees on
    votes_on_stop: bool = False
    vote: Any = None  # its ``pserver.roles.stop_vote`` vote (None: no vote in this run)
    #: set by the trainer to ``Trainer.interrupt``: whether a learner waiting in a pull
    #: should leave it and stop where it is
    interrupt: Callable[[], bool] = staticmethod(lambda: False)

    @abstractmethod
    def weights(self) -> Any | None: ...

    @abstractmethod
    def gradient_buffer(self) -> Any: ...

    @abstractmethod
    def gradient(self, g: Any) -> None: ...

    @abstractmethod
    def staleness(self) -> tuple[float, int]: ...

    @abstractmethod
    def done(self) -> float: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def finish(self) -> None: ...

    @abstractmethod
    def state(self) -> State: ...

    @abstractmethod
    def restore(self, state: State) -> None: ...

    def attach(self, records: Any) -> None:
        """Its rows go with the trainer's, in one stream (only the learners-only write any)."""
        return None  # an optional hook: most exchanges write no rows of their own

    def stop_agreed(self) -> bool:
        """At this step boundary: stop here, every learner at the same one (``votes_on_stop``
        exchanges only)."""
        return False

    def signalled(self) -> None:
        """A signal ended the run before the data did (called before ``finish()``)."""
        return None  # an optional hook: only a cut of its own needs it
