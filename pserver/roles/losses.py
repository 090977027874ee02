"""The statistics server's account of lost learners (issue 22): the ``learners_lost`` rows.

A learner that dies while the run goes on (Open MPI's ULFM, ``pserver.comm.departures``) sends
no goodbye: the statistics server stops waiting for it once its failure is known, and records
which learner it was, when it was seen lost, its last train step and λ from then on. The rows
are written at the end of the run, when every row that was on its way has arrived: ``last_step``
is the last step the dump knows of (its train rows, or its pushes that reached shard 0; a
learner's unsent train rows die with it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pserver.comm.waiting import PeerLog
    from pserver.plan.topology import Layout


class Losses:
    """Lost learners as one rank (the statistics server) saw them: ``layout`` (the learners
    and their indices), ``peers`` (which ranks died, their names), ``log`` (a warning per loss)
    and ``now`` (seconds since the run's common start)."""

    def __init__(
        self, layout: Layout, peers: PeerLog, log: logging.Logger, now: Callable[[], float]
    ) -> None:
        self.layout, self.peers, self.log, self.now = layout, peers, log, now
        self.learners = len(layout.learners)  # λ, less the losses seen so far
        self.last: dict[int, int] = {}  # learner -> its highest train step received
        self.pushed: dict[int, int] = {}  # learner -> its gradients shard 0 received
        self.rows: list[dict[str, Any]] = []

    def lost(self, live: set[int]) -> list[int]:
        """The ranks of ``live`` that died (none without ULFM)."""
        d = self.peers.departures
        return [] if d is None else sorted(live & d.lost().keys())

    def pending(self, live: set[int]) -> bool:
        return bool(self.lost(live))

    def steps(self, rows: dict[str, dict[str, list[Any]]]) -> None:
        """Note a batch of rows: each learner's train steps, and its gradients at shard 0
        (one per step: a learner pushes every block once; its last train rows may die with
        it, unsent, the shard's rows of its pushes do not)."""
        train, grads = rows.get("train"), rows.get("gradients")
        if train:
            for learner, step in zip(train["learner"], train["step"], strict=True):
                self.last[int(learner)] = max(self.last.get(int(learner), -1), int(step))
        if grads:
            for shard, learner in zip(grads["shard"], grads["learner"], strict=True):
                if int(shard) == 0:
                    self.pushed[int(learner)] = self.pushed.get(int(learner), 0) + 1

    def last_step(self, learner: int) -> int:
        """The last step of ``learner`` the dump knows of: its last train row, or its last
        push that reached shard 0 (-1: none)."""
        return max(self.last.get(learner, -1), self.pushed.get(learner, 0) - 1)

    def take(self, live: set[int]) -> None:
        """Stop waiting for the learners of ``live`` that died, and note each loss."""
        for rank in self.lost(live):
            live.discard(rank)
            self.learners -= 1
            learner = self.layout.index(rank)
            now = self.now()
            self.rows.append(
                {"learner": learner, "rank": rank, "time": now, "learners": self.learners}
            )
            self.log.warning(
                "learner %d lost (%s) at t=%.1fs, last step seen %d; the run goes on with "
                "λ = %d (learners_lost)",
                learner, self.peers.name(rank), now, self.last_step(learner),
                self.learners,
            )  # fmt: skip

    def write(self, writer: Any) -> None:
        """The ``learners_lost`` rows, with the last step each lost learner's rows reached."""
        for row in self.rows:
            step = self.last_step(row["learner"])
            writer.append("learners_lost", last_step=[step], **{k: [v] for k, v in row.items()})
