"""The learners' average model on its way to the statistics server (learners-only runs).

A learners-only run has no shard to snapshot the model at epoch ends, so one learner does it:
learner 0 sends, per parameter block, the model the statistics server tests (IBM tests the
averaged model). Under SYNC every learner holds the same weights, so learner 0's are the
average; a strategy whose learners differ (ADPSGD) first averages them (an allreduce of the
weights among the learners, divided by λ) and hands the average to :meth:`ModelReport.send`.

The sends are the shards' (:class:`pserver.roles.snapshots.Snapshots`): never waiting for the
statistics server while training, a full queue skips that epoch's test (recorded), and the
final model is always sent, by :meth:`ModelReport.drain` at the end, so the dump's
``model/weights`` is the average model of the last step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pserver.comm.waiting import Waiter
from pserver.roles.snapshots import Snapshots, StatsLink, snapshot_queue

if TYPE_CHECKING:
    from pserver.plan.topology import Block

SENDER = 0  # the learner index that reports the model


class ModelReport:
    """Learner ``SENDER``'s snapshots of every block; a no-op on the other learners."""

    def __init__(
        self, link: StatsLink, learner: int, blocks: Sequence[Block], model_bytes: int, dtype: Any
    ) -> None:
        """``learner``: this learner's index; ``blocks``: the model's parameter blocks;
        ``model_bytes``: the model's size (the snapshot queue's depth follows from it)."""
        self.sends = learner == SENDER
        self.blocks = tuple(blocks)
        depth = snapshot_queue(model_bytes)
        self.snaps = [Snapshots(link, b.index, b.size, dtype, depth) for b in self.blocks]

    def send(self, w: Any, epoch: int, ts: int) -> None:
        """The model ``w`` after the step ``ts`` that ended ``epoch``, for its test."""
        if self.sends:
            for b, s in zip(self.blocks, self.snaps, strict=True):
                s.send(w[b.start : b.stop], epoch, ts)

    def drain(self, w: Any, ts: int, waiter: Waiter) -> None:
        """End of the run: the queued snapshots, then the final model (waits are fine now)."""
        if self.sends:
            for b, s in zip(self.blocks, self.snaps, strict=True):
                s.drain(w[b.start : b.stop], ts, waiter)

    @property
    def skipped(self) -> int:
        return sum(s.skipped for s in self.snaps)
