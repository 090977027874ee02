"""Partial pulling of PSP-SGD (Algorithm 1, worker lines 3-15): compute without the slow blocks.

A learner iteration starts from its previous copy of the model (worker lines 3-4), asks every
block for newer weights, and stops waiting once ``ceil(fraction · blocks)`` of them have come
back fresh and ``tau2`` more seconds have passed, or once every block has come back (line 15).
A reply older than the iteration requires is dropped (lines 10-11) and the block keeps its
previous copy; so does a block whose reply has not arrived yet. Those are the :meth:`missing`
blocks: the learner computes with its old copy of them, leaves their requests outstanding, and
judges the late replies when they land, against the requirement of the iteration in progress
then.

The requirement is per block and comes from the driver (:meth:`PartialPull.start`):

* Rudra-style (recommended with PSP's partial push): ``wanted[b] = have[b] + 1``, "weights newer
  than the copy my last gradient came from". With ``fraction = 1`` this is Hardsync's pull.
  A block that missed an iteration keeps ``have[b]``, so its late reply (the server only answers
  with weights newer than that) is accepted in the next iteration.
* Algorithm 1 verbatim: ``wanted = t`` (an int) for the learner's iteration ``t``, when the
  servers' block timestamps advance in step with the learners' iterations.

No MPI, no arrays: the driver posts the receives, reports each reply with :meth:`on_block`,
installs the blocks for which it returns True, and waits until :meth:`ready` (or
:meth:`deadline`) before computing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: Guards ceil() against products like 0.7 * 10 = 7.000000000000001.
EPS = 1e-9


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
        n = len(self.wanted)
        self.need = min(n, max(1, math.ceil(self.fraction * n - EPS))) if n else 0
        self.need_time = now if self.need == 0 else None

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
