"""The statistics server's account of lost learners (issue 22): the ``learners_lost`` rows.

A learner that dies while the run goes on (Open MPI's ULFM, ``pserver.comm.departures``) sends
no goodbye: the statistics server stops waiting for it once its failure is known, and records
which learner it was, when it was seen lost, its last train step and λ from then on. The rows
are written at the end of the run, when every train row that was on its way has arrived, so
``last_step`` is the last step the dump holds.
"""

from __future__ import annotations

from typing import Any

from pserver.runtime.context import Context


class Losses:
    """Lost learners as one rank (the statistics server) saw them."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.learners = len(ctx.layout.learners)  # λ, less the losses seen so far
        self.last: dict[int, int] = {}  # learner -> its highest train step received
        self.rows: list[dict[str, Any]] = []

    def lost(self, live: set[int]) -> list[int]:
        """The ranks of ``live`` that died (none without ULFM)."""
        d = self.ctx.peers.departures
        return [] if d is None else sorted(live & d.lost().keys())

    def pending(self, live: set[int]) -> bool:
        return bool(self.lost(live))

    def steps(self, train: dict[str, list[Any]] | None) -> None:
        """Note the train steps of a batch of rows (``train`` columns, or None)."""
        if not train:
            return
        for learner, step in zip(train["learner"], train["step"], strict=True):
            self.last[int(learner)] = max(self.last.get(int(learner), -1), int(step))

    def take(self, live: set[int]) -> None:
        """Stop waiting for the learners of ``live`` that died, and note each loss."""
        for rank in self.lost(live):
            live.discard(rank)
            self.learners -= 1
            learner = self.ctx.layout.index(rank)
            now = self.ctx.now()
            self.rows.append(
                {"learner": learner, "rank": rank, "time": now, "learners": self.learners}
            )
            self.ctx.log.warning(
                "learner %d lost (%s) at t=%.1fs after step %d; the run goes on with "
                "λ = %d (learners_lost)",
                learner, self.ctx.peers.name(rank), now, self.last.get(learner, -1),
                self.learners,
            )  # fmt: skip

    def write(self, writer: Any) -> None:
        """The ``learners_lost`` rows, with the last step each lost learner's rows reached."""
        for row in self.rows:
            step = self.last.get(row["learner"], -1)
            writer.append("learners_lost", last_step=[step], **{k: [v] for k, v in row.items()})
