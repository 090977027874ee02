"""The protocol interface: a pure state machine that a server block consults.

The server driver reports each gradient's arrival (``on_gradient``) and asks whether an update
is due (``ready``); ``commit`` then says how to combine what was accepted. No MPI, no arrays:
protocols are tested by feeding them scripted arrivals.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arrival:
    """A gradient for one block reached the server."""

    learner: int
    timestamp: int  # timestamp of the weights it was computed from
    time: float = 0.0
    #: the learner's iteration tag (PSP-SGD Algorithm 1, worker line 17), or None: the
    #: gradient answers round ``timestamp`` (the block rule, see protocols/rounds.py)
    iteration: int | None = None


@dataclass(frozen=True)
class GradientDecision:
    accept: bool
    staleness: int
    weight: float = 1.0  # factor on this gradient in the aggregate (per-gradient lr modulation)
    reason: str = ""  # why it was dropped


@dataclass(frozen=True)
class UpdateDecision:
    """How to turn the accepted gradients into one update of the weights."""

    new_timestamp: int
    vector_clock: tuple[int, ...]
    learners: tuple[int, ...]
    mean_staleness: float  # eq. (2)
    divisor: float  # the aggregate is divided by this (c, or λ in hardsync)
    lr_scale: float  # the base learning rate is multiplied by this


@dataclass
class Pending:
    clock: list[int] = field(default_factory=list)
    learners: list[int] = field(default_factory=list)

    def add(self, arrival: Arrival) -> None:
        self.clock.append(arrival.timestamp)
        self.learners.append(arrival.learner)

    def __len__(self) -> int:
        return len(self.clock)


class Protocol(abc.ABC):
    """One block's synchronization policy."""

    name: str = "protocol"
    #: Learners ask for weights newer than those they last pushed from (hardsync's lockstep).
    waits_for_update: bool = False

    def __init__(self) -> None:
        self.pending = Pending()

    @abc.abstractmethod
    def on_gradient(self, arrival: Arrival, server_ts: int) -> GradientDecision:
        """Accept or drop one gradient arriving while the weights are at ``server_ts``."""

    @abc.abstractmethod
    def ready(self, now: float | None = None) -> bool:
        """Whether enough gradients were accepted for an update (at time ``now``)."""

    def deadline(self) -> float | None:
        """When ``ready`` turns true with no further arrival (a timeout); None: arrivals only."""
        return None

    def pull_ready(self, learner: int) -> bool:
        """Whether a pull of ``learner`` may be answered now (SSP holds those too far ahead)."""
        return True

    def retire(self, learner: int) -> None:
        """``learner`` has finished: it must no longer hold anything back."""
        del learner  # most protocols keep no per-learner state

    def lose(self, learner: int) -> None:
        """``learner`` died (a lost learner, Open MPI's ULFM): it will send nothing more, and
        whatever counts λ is recomputed for the learners left. Without a quorum of its own a
        protocol treats it as retired."""
        self.retire(learner)

    @abc.abstractmethod
    def commit(self, server_ts: int) -> UpdateDecision:
        """Close the current round: what the update from ``server_ts`` to the next is made of."""

    def describe(self) -> str:
        return self.name
