"""Partial pulling of PSP-SGD (Algorithm 1, worker lines 3-15): compute without the slow blocks.

A learner iteration starts from its previous copy of the model (worker lines 3-4), asks every
block for newer weights, and stops waiting once ``ceil(fraction · blocks)`` of them have come
back fresh and ``tau2`` more seconds have passed, or once every block has come back (line 15).
A reply older than the iteration requires does not count toward ``b`` (lines 10-11), and a
block whose reply has not arrived yet keeps its previous copy. Those are the :meth:`missing`
blocks: the learner computes with its old copy of them, leaves their requests outstanding, and
judges the late replies when they land, against the requirement of the iteration in progress
then. One departure from line 11 ("drop"): a reply too old for the iteration but newer than the
learner's copy still replaces that copy (:meth:`judge`), and the block is asked again. Dropped,
a block whose reply always lands just after the ``b``-th one (the second of two blocks of one
shard, ``b = 1/2``, ``tau2 = 0``) would keep the learner's first copy for the whole run, and
every gradient of the other blocks would be computed against it (docs/protocols.md, "Partial
pulling"). A block that answers STOP leaves the iteration (:meth:`PartialPull.forget`): it is
done and will never send newer weights.

The requirement and the tag the pushes carry come from :class:`PullRule`
(``protocol.pull_timestamp``; the rules and the liveness proof are in
:mod:`pserver.protocols.rounds`):

* ``block`` (Rudra): ``wanted[b] = have[b] + 1``, "weights newer than the copy my last
  gradient came from", and each block's push carries that block's timestamp. With
  ``fraction = 1`` this is Hardsync's pull. With ``fraction < 1`` and a protocol that waits for
  every learner it can deadlock (a gradient from a kept copy never counts as the learner's
  response), so that combination is refused before training.
* ``iteration`` (Algorithm 1 verbatim): ``wanted = W`` (an int) for the learner's iteration
  ``W``, and every push of the iteration carries the tag ``τ = max(W, min have)``.

No MPI, no arrays: the driver posts the receives, reports each reply with :meth:`on_block`,
installs the blocks for which it returns True, and waits until :meth:`ready` (or
:meth:`deadline`) before computing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: Guards ceil() against products like 0.7 * 10 = 7.000000000000001.
EPS = 1e-9

BLOCK, ITERATION = "block", "iteration"
#: :meth:`PartialPull.judge`'s verdicts on a reply
USE, REFRESH, DROP = "use", "refresh", "drop"


class PartialPull:
    """One learner's pull state over ``n_blocks`` blocks (ids ``0 .. n_blocks − 1``).

    ``fraction`` is the paper's b (0 < b <= 1), ``tau2`` the timeout in seconds after ``b`` of
    the blocks have arrived (0: compute at once).
    """

    def __init__(self, n_blocks: int, fraction: float, tau2: float) -> None:
        if n_blocks < 1:
            raise ValueError(f"partial pulling needs at least one block, got {n_blocks}")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"partial pulling needs 0 < fraction <= 1, got {fraction}")
        if not tau2 >= 0.0:  # also rejects NaN
            raise ValueError(f"partial pulling needs a timeout tau2 >= 0, got {tau2}")
        self.n_blocks = n_blocks
        self.fraction = float(fraction)
        self.tau2 = float(tau2)
        self.iteration = -1  # incremented by start()
        self.wanted: dict[int, int] = {}
        self.used: dict[int, int] = {}  # block -> timestamp installed this iteration
        self.dropped = 0  # replies older than required, this iteration
        self.need = 0
        self.need_time: float | None = None  # when the need-th fresh block arrived

    def start(self, now: float, wanted: Mapping[int, int] | int) -> None:
        """Begin an iteration at time ``now`` (worker line 2).

        ``wanted`` maps each block the iteration waits for to the oldest timestamp it accepts;
        an int applies to all ``n_blocks``. Blocks left out (e.g. stopped ones) are neither
        waited for nor counted in ``fraction``.
        """
        if isinstance(wanted, int):
            wanted = dict.fromkeys(range(self.n_blocks), wanted)
        for b in wanted:
            self.check(b)
        self.iteration += 1
        self.wanted = dict(wanted)
        self.used = {}
        self.dropped = 0
        self.need_time = None
        self.count(now)

    def count(self, now: float) -> None:
        """The blocks this iteration needs, ``ceil(b · waited-for blocks)``; time the b-th."""
        n = len(self.wanted)
        self.need = min(n, max(1, math.ceil(self.fraction * n - EPS))) if n else 0
        if self.need_time is None and len(self.used) >= self.need:
            self.need_time = now

    def forget(self, block: int, now: float) -> None:
        """``block`` answered STOP: no longer waited for, nor counted in ``fraction``.

        Waiting for it would be waiting for weights that will never come (the liveness proof
        of :mod:`pserver.protocols.rounds` assumes a STOP ends the wait, A4).
        """
        self.check(block)
        self.wanted.pop(block, None)
        self.used.pop(block, None)
        self.count(now)

    def on_block(self, block: int, timestamp: int, now: float) -> bool:
        """A reply for ``block`` with weights at ``timestamp`` arrived: use it (lines 10-13)?

        True: install it for this iteration. False: it is older than required (dropped; the
        learner keeps its copy and should ask again) or the block is not waited for.
        """
        self.check(block)
        if self.iteration < 0:
            raise RuntimeError("PartialPull.on_block() before the first start()")
        required = self.wanted.get(block)
        if required is None or timestamp < required:
            self.dropped += 1
            return False
        self.used[block] = timestamp  # a newer reply for a used block replaces the older
        if self.need_time is None and len(self.used) >= self.need:
            self.need_time = now  # line 15: the τ2 timer starts at the b-th fresh block
        return True

    def judge(self, block: int, timestamp: int, have: int, now: float) -> str:
        """A WEIGHTS reply for ``block`` at ``timestamp``; the learner's copy is at ``have``.

        :data:`USE`: it counts for this iteration (:meth:`on_block`). :data:`REFRESH`: too old
        for the iteration but newer than the copy, so it replaces the copy without counting
        toward ``b`` (computing on it is never staler than on the copy, and the iteration tag
        ``max(W, min have)`` only rises: rounds.py's A2 holds). :data:`DROP`: neither.
        """
        if self.on_block(block, timestamp, now):
            return USE
        return REFRESH if timestamp > have else DROP

    def ready(self, now: float) -> bool:
        """Line 15's exit test: every block in, or ``b`` of them in and ``tau2`` elapsed."""
        if len(self.used) == len(self.wanted):
            return True
        deadline = self.deadline()
        return deadline is not None and (self.tau2 == 0.0 or now >= deadline)

    def deadline(self) -> float | None:
        """When ready() turns true with no other reply: ``t_b + tau2``; None below ``b``."""
        return None if self.need_time is None else self.need_time + self.tau2

    def missing(self) -> set[int]:
        """Blocks waited for but not (yet) received fresh: computed from the previous copy."""
        return self.wanted.keys() - self.used.keys()

    @property
    def stale_fraction(self) -> float:
        """Share of this iteration's blocks computed from an old copy (read it when ready)."""
        return len(self.missing()) / len(self.wanted) if self.wanted else 0.0

    def check(self, block: int) -> None:
        if not 0 <= block < self.n_blocks:
            raise ValueError(f"block {block} out of range 0..{self.n_blocks - 1}")


class PullRule:
    """Which weights a learner's pull asks for, and which iteration tag its pushes carry.

    ``rule`` is ``"block"`` or ``"iteration"`` (``protocol.pull_timestamp`` resolved by
    :func:`pserver.plan.config.pull_timestamp`); ``waits_for_update``: the protocol's (hardsync,
    psp).

    Iteration rule (PSP-SGD Algorithm 1, worker lines 2, 10-13, 17): ``tag`` is the tag of the
    last push (0: the first minibatch runs on w0 at iteration 0). The next iteration ``W =
    tag + 1`` asks every block for weights ``>= W``; once the pull is over, :meth:`pulled` sets
    the tag of this iteration's pushes to ``max(W, min have)``. The ``min have`` catches a
    learner up that fell behind the blocks (a straggler under ``c < λ``, whose every gradient
    would otherwise be dropped as ``t' < t``), without ever tagging a push past the block it
    goes to (``tag <= have[j] <= ts_j``): assumption A2 of the liveness proof.
    """

    def __init__(self, rule: str, waits_for_update: bool) -> None:
        if rule not in (BLOCK, ITERATION):
            raise ValueError(f"pull rule {rule!r}: expected {BLOCK!r} or {ITERATION!r}")
        self.rule = rule
        self.waits_for_update = waits_for_update
        self.tag = 0

    def oldest(self, have: int) -> int:
        """The oldest timestamp a pull of a block held at ``have`` accepts now."""
        if self.rule == ITERATION:
            return self.tag + 1
        return have + 1 if self.waits_for_update else 0

    def pulled(self, have: Mapping[int, int]) -> None:
        """The pull of an iteration is over; ``have``: the timestamps of the live blocks."""
        if self.rule == ITERATION and have:
            self.tag = max(self.tag + 1, min(have.values()))

    def push_iteration(self) -> int | None:
        """The iteration tag of this iteration's pushes; None under the block rule."""
        return self.tag if self.rule == ITERATION else None
