"""ADPSGD's ring schedule and gossip arithmetic (IBM paper §3, Fig. 3b and Fig. 4), pure.

Roles
-----
Learner ``i`` (0-based, λ learners) is an **active sender** when ``i`` is even and a
**passive receiver** when it is odd (the paper's odd/even ids, 1-based). After each local
update a sender starts one exchange with a neighbour, alternating its left and right neighbour
(:meth:`Ring.partner`); a receiver never starts one: its communication thread answers whichever
neighbour asks, one exchange at a time, in the order the requests arrive.

The communication graph (:meth:`Ring.neighbours`) is the ring 0–1–…–(λ−1)–0 when λ is even.
When λ is odd the ring has an odd cycle and cannot be two-coloured: the edge (λ−1, 0) would
join two senders. That one edge is left out, so the graph is the path 0–1–…–(λ−1), which
starts and ends with a sender (each of the two end senders has a single neighbour and
"alternates" between it and itself). λ = 2 is the single edge 0–1.

Liveness (no deadlock, every λ ≥ 2)
-----------------------------------
Every edge of the graph joins a sender and a receiver (bipartite by construction above).
A sender waits only for the receiver it asked (the reply to its request). A receiver never
waits for anyone to serve a request: the sender's weights were sent with its request, so
answering takes only a send of its own weights and a local average. Hence in the wait-for
graph every edge goes sender → receiver and no edge leaves a receiver: it has no cycle, so
every wait ends (the paper: "bipartition … guarantees acyclic communication"). A receiver's
main thread never waits on the exchange, and a receiver keeps answering while it computes
(its communication thread), so a slow receiver delays a sender by one answer at most, never by
its compute (straggler immunity, Table 3).

Termination (goodbyes are messages)
-----------------------------------
A sender that has taken its last minibatch waits for its last exchange to complete, then sends
a goodbye to each neighbour and leaves: after that completion no message of its receivers is
on its way to it (a receiver only ever answers). A receiver leaves once it has taken its last
minibatch **and** has a goodbye from every neighbour (:class:`Goodbyes`); until then it keeps
answering. A sender's goodbye follows its last request on the same channel, which MPI keeps in
order, so a request can never arrive after its sender's goodbye (checked: :class:`Goodbyes`
raises). Each of those waits ends by the liveness argument above.

A lost learner (issue 22, Open MPI's ULFM)
------------------------------------------
:meth:`Ring.lose` is the ring of the survivors: the learners keep their order and are
numbered again 0…λ′−1 by **position** (:attr:`Ring.members` maps a position to the learner's
id of the run's start), and roles and neighbours are those of a fresh ring of λ′ — even
positions send, odd ones receive, the edge (λ′−1, 0) cut when λ′ is odd — so the graph is
bipartite again by the construction above. Keeping the old roles would not do: the dead
learner's two neighbours have the same role and cannot be joined, so an odd ring (a path)
would fall apart in two, and after a second loss two senders could be left alone. Positions
are the ranks of the learners' communicator shrunk to the survivors (MPI keeps their
relative order), so every survivor computes the same ring from the same set of losses. A
ring of one learner has no neighbour: it trains alone. The exchange switches to the new
ring only at a cut where no exchange of the old one is in flight (``pserver.roles.gossip``:
the old communicator is revoked, so every request on it ends, then shrunk).

Atomicity (the doubly stochastic mix)
-------------------------------------
The paper requires w_i ← (w_i + w_j)/2 on both sides with the **same** pair of models, so each
exchange multiplies the stacked models by a doubly stochastic symmetric matrix (the sum of the
models is unchanged). The exchange (``pserver.roles.gossip``) guarantees it so: a sender does
not apply its next update until its exchange has completed (Fig. 3b: ``pull_weights`` before
``apply``), so the model it sent is still its model when the answer is averaged in; a
receiver's answer (snapshot of its model, then the average) and its own updates run under one
lock, so no update falls between the snapshot it sends and the average it keeps. The gradients
are computed on a snapshot taken under that lock (staleness ≥ 1, Table 1: "at best 1").

Staleness
---------
Each learner counts its own steps; its vector clock (:class:`VectorClock`) holds, for every
learner, the latest of that learner's steps mixed into its model (directly or through
neighbours), merged elementwise by max at each exchange. The age of the neighbour model an
exchange averaged with is ``max(0, own step − neighbour's step)`` (:func:`age`; the row keeps
both step counts, so the signed difference is in the dump too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SENDER = "sender"
RECEIVER = "receiver"

# the gossip's message kinds and tags are the wire's (pserver.comm.wire.GossipKind, GossipTag)


class GossipError(RuntimeError):
    """A message that breaks the schedule (a request after a goodbye, from a non-neighbour)."""


@dataclass(frozen=True)
class Ring:
    """The bipartite ring of ``size`` learners (see the module docstring). Its methods speak
    in positions 0…size−1; ``members`` are the learners at those positions (default: learner
    ``i`` at position ``i``; after :meth:`lose`, the survivors in their order)."""

    size: int
    members: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.members:
            if self.size < 2:
                raise ValueError(f"ADPSGD needs at least 2 learners, not {self.size}")
            object.__setattr__(self, "members", tuple(range(self.size)))
        if len(self.members) != self.size or self.size < 1:
            raise ValueError(f"a ring of {self.size} learners with members {self.members}")
        if list(self.members) != sorted(set(self.members)):
            raise ValueError(f"ring members {self.members} are not distinct and in order")

    def lose(self, learner: int) -> Ring:
        """The ring of the survivors once ``learner`` (a member's id) is lost (module
        docstring, *A lost learner*)."""
        if learner not in self.members:
            raise ValueError(f"learner {learner} is not in the ring {self.members}")
        if self.size == 1:
            raise ValueError("the last learner of the ring cannot be lost")
        return Ring(self.size - 1, tuple(m for m in self.members if m != learner))

    def position(self, learner: int) -> int:
        """The position of ``learner`` (its rank in the learners' communicator of this ring)."""
        return self.members.index(learner)

    def role(self, i: int) -> str:
        return SENDER if i % 2 == 0 else RECEIVER

    def neighbours(self, i: int) -> tuple[int, ...]:
        """``i``'s neighbours, left first; the edge (λ−1, 0) is left out when λ is odd."""
        n = self.size
        if n == 1:
            return ()  # the last learner: it trains alone
        left, right = (i - 1) % n, (i + 1) % n
        cut = n % 2 == 1  # odd ring: (n-1, 0) would join two senders
        out = []
        if not (cut and i == 0):
            out.append(left)
        if not (cut and i == n - 1) and right not in out:
            out.append(right)
        return tuple(out)

    def partner(self, i: int, k: int) -> int:
        """The neighbour sender ``i`` exchanges with after its ``k``-th update (left, right, …)."""
        if self.role(i) != SENDER:
            raise ValueError(f"learner {i} is a receiver: it starts no exchange")
        nb = self.neighbours(i)
        if not nb:
            raise ValueError(f"learner {i} is alone in the ring: it has no partner")
        return nb[k % len(nb)]

    def edges(self) -> set[frozenset[int]]:
        return {frozenset((i, j)) for i in range(self.size) for j in self.neighbours(i)}


class Goodbyes:
    """A receiver's book of the senders that may still ask it: it may leave once empty."""

    def __init__(self, ring: Ring, me: int) -> None:
        self.me = me
        self.expected = set(ring.neighbours(me))
        self.gone: set[int] = set()

    def request(self, sender: int) -> None:
        """A request from ``sender`` arrived: refuse one from a stranger or after its goodbye."""
        if sender in self.gone:
            raise GossipError(f"learner {self.me}: a request from {sender} after its goodbye")
        if sender not in self.expected:
            raise GossipError(f"learner {self.me}: a request from {sender}, not a neighbour")

    def bye(self, sender: int) -> None:
        if sender not in self.expected:
            raise GossipError(f"learner {self.me}: a goodbye from {sender}, unexpected or twice")
        self.expected.discard(sender)
        self.gone.add(sender)

    @property
    def done(self) -> bool:
        return not self.expected


class VectorClock:
    """Learner ``me``'s vector clock over ``size`` learners (see the module docstring)."""

    def __init__(self, size: int, me: int) -> None:
        self.me = me
        self.steps = [0] * size

    def tick(self) -> None:
        """One local update applied."""
        self.steps[self.me] += 1

    @property
    def own(self) -> int:
        return self.steps[self.me]

    def merge(self, other: Sequence[int]) -> None:
        """The neighbour's clock (as it was when its model was taken) is now mixed into ours."""
        self.steps = [max(a, int(b)) for a, b in zip(self.steps, other, strict=True)]


class GossipLedger:
    """One learner's gossip bookkeeping (pure): its vector clock, the averages mixed into its
    model, the version of the model its next gradient is computed on, the sender's exchange
    index, and the staleness σ of each gradient it applies. The real exchange
    (``pserver.roles.gossip``) and the simulated one (``pserver.sim.gossip``) both keep their
    books here, so the dump's σ and ``exchanges`` rows follow one rule.

    σ (docs/stats.md, *Staleness σ*: one definition for every family): the model's
    **version** counts the updates applied to it, local steps and averages; a gradient's σ is
    the version at its update minus the version it was computed on, i.e. the averages mixed in
    meanwhile (no local step can fall between: only the learner's own thread applies them).
    IBM §3, Table 1: "at best 1"."""

    def __init__(self, ring: Ring, me: int) -> None:
        self.ring, self.me = ring, me
        self.role = ring.role(me)
        self.clock = VectorClock(ring.size, me)
        self.exchanged = 0  # averages mixed into the model
        self.snap_version = 0  # version() of the model the next gradient is computed on
        self.k = 0  # a sender's exchanges started (its partner alternates with it)

    def version(self) -> int:
        """The version of the model: the updates applied to it so far."""
        return self.clock.own + self.exchanged

    def snapshot(self) -> None:
        """The next gradient is computed on the model as it is now."""
        self.snap_version = self.version()

    def gradient(self) -> tuple[int, int]:
        """(version it was computed on, σ) of the gradient about to be applied."""
        return self.snap_version, self.version() - self.snap_version

    def stepped(self) -> int | None:
        """The local update is applied: one more step; the partner a sender now exchanges
        with (``Ring.partner``), None for a receiver."""
        self.clock.tick()
        if self.role != SENDER or not self.ring.neighbours(self.me):  # alone after losses
            return None
        partner = self.ring.partner(self.me, self.k)
        self.k += 1
        return partner

    def regroup(self, ring: Ring, me: int) -> None:
        """After a loss (:meth:`Ring.lose`): the survivors' ring, with this learner at position
        ``me`` and its role there; the clock stays over the learners of the run's start and the
        exchange index goes on (the partner schedule alternates from there)."""
        self.ring, self.me, self.role = ring, me, ring.role(me)

    def mixed(self, partner_step: int, partner_clock: Sequence[int]) -> tuple[int, int]:
        """A neighbour's model (of its step ``partner_step``, with its clock) is averaged into
        ours: (our step, the neighbour model's age), then the clock merges and the version
        grows by one."""
        step = self.clock.own
        self.clock.merge(partner_clock)
        self.exchanged += 1
        return step, age(step, partner_step)


def averages_again(
    completed: Sequence[int], inflight: int | None, due: Iterable[int], common: int
) -> tuple[list[int], list[int]]:
    """After a loss, where one learner's epoch averages go on (``pserver.roles.gossip_model``):
    ``completed`` are the epochs whose average completed here, in order, ``inflight`` the one
    abandoned, ``due`` those not posted yet, ``common`` how many of the common sequence every
    survivor completed (their minimum). Returns (completed, due): the first ``common`` kept,
    every later one averaged again, in the order all survivors post them."""
    if common > len(completed):
        raise ValueError(f"{common} epochs completed everywhere but {len(completed)} here")
    again = list(completed[common:]) + ([inflight] if inflight is not None else []) + list(due)
    return list(completed[:common]), again


def age(own_step: int, partner_step: int) -> int:
    """Age in steps of a neighbour's model averaged with ours: how many steps fewer than ours
    it had taken; 0 when it had taken as many or more (σ ≥ 0, as the shards' staleness)."""
    return max(0, own_step - partner_step)


def local_epoch(step: int, n_learners: int, batch: int, train_size: int) -> float:
    """The (0-based, fractional) epoch of a learner's ``step`` for its learning-rate schedule:
    λ learners at its pace have taken ``step·λ`` minibatches (λ = 1: the serial reference's)."""
    return step * n_learners * batch / train_size


def average(xp: Any, w: Any, other: Any) -> None:
    """w ← (w + w')/2 in place (IBM eq. 4, second line)."""
    w += other
    w *= 0.5


def sum_to_mean(xp: Any, total: Any, n_learners: int) -> None:
    """The learners' summed models (an allreduce) ← their average, in place: what the statistics
    server tests (IBM §4 evaluates the learners' average model). Multiplies by 1/λ, as every run
    has, so the reported models stay the same bit for bit."""
    xp.multiply(total, 1.0 / n_learners, out=total)


def mean_models(models: Iterable[Any]) -> Any:
    """The learners' average model (what the statistics server tests and the dump keeps)."""
    models = list(models)
    total = models[0].copy()
    for m in models[1:]:
        total += m
    return total / len(models)
