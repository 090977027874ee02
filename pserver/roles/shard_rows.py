"""The dump rows a shard writes (``docs/stats.md``): ``gradients``, ``staleness``, ``updates``,
``delays``, and at the end ``servers`` and ``blocks``.

Every block of a shard sees the same pushes in the same order and updates with the others, so
the per-gradient and per-update rows come from the shard's first block alone: one row per shard
keeps the dump lean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pserver.comm.records import RecordBuffer
from pserver.optim.prediction import Predictor, paper_staleness
from pserver.protocols.base import UpdateDecision
from pserver.protocols.shard_block import Applied, ShardBlock


class ShardRows:
    def __init__(
        self, records: RecordBuffer, shard: int, first_block: int, now: Callable[[], float]
    ) -> None:
        self.records, self.shard, self.first_block, self.now = records, shard, first_block, now

    def gradient(self, block: int, learner: int, ts: int, sigma: int, update: int) -> None:
        """One gradient's fate: ``update`` is the timestamp it entered, -1 if dropped. An
        applied one is also a ``staleness`` row (docs/stats.md, *Staleness σ*): a dropped
        gradient changed no weights, so it has no σ."""
        if block == self.first_block:
            now = self.now()
            self.records.add(
                "gradients", shard=self.shard, learner=learner, timestamp=ts, staleness=sigma,
                update=update, time=now,
            )  # fmt: skip
            if update != -1:
                self.records.add(
                    "staleness", learner=learner, owner=self.shard, version=ts,
                    staleness=sigma, time=now,
                )  # fmt: skip

    def update(self, block: int, d: UpdateDecision, lr: float) -> None:
        if block == self.first_block:
            self.records.add(
                "updates", shard=self.shard, timestamp=d.new_timestamp, time=self.now(),
                n_gradients=len(d.vector_clock), mean_staleness=d.mean_staleness, lr=lr,
            )  # fmt: skip
            self.records.add_clock(d.vector_clock)

    def prediction(self, block: int, applied: Applied, predictor: Predictor) -> None:
        """PP-ASGD: the S the new weights are served with (first block), and every block's
        error probe that ended at this update."""
        ts = applied.decision.new_timestamp
        if block == self.first_block:
            self.records.add(
                "predictions", shard=self.shard, timestamp=ts, steps=applied.steps,
                staleness_mean=predictor.mean.value,
            )  # fmt: skip
        p = applied.probe
        if p is not None:
            self.records.add(
                "prediction_errors", shard=self.shard, block=block, origin=p.origin,
                steps=p.steps, horizon=p.horizon, dd=p.dd, dm=p.dm, mm=p.mm, error=p.error,
                momentum=predictor.mu, time=self.now(),
            )  # fmt: skip

    def delay(self, learner: int, block: int, request: int, delay: float) -> None:
        """An injected delay of one pull's reply (``inject``)."""
        self.records.add(
            "delays", shard=self.shard, learner=learner, block=block, request=request,
            time=self.now(), delay=delay,
        )  # fmt: skip

    def end(self, blocks: Iterable[tuple[int, int, ShardBlock]], **totals: Any) -> None:
        """The ``servers`` row (``totals``) and one ``blocks`` row per (index, size, block)."""
        blocks = list(blocks)
        self.records.add(
            "servers", shard=self.shard, updates=max(a.ts for _, _, a in blocks), **totals,
            **self.records.usage(),
        )  # fmt: skip
        for index, size, a in blocks:
            self.records.add(
                "blocks", block=index, shard=self.shard, timestamp=a.ts, applied=a.applied,
                dropped=a.dropped, size=size,
            )  # fmt: skip


def prediction_summary(a: ShardBlock, learners: int) -> str:
    """The log line on PP-ASGD's staleness at the end: the measured S̄ and the paper's eq. (1)."""
    p = a.predictor
    assert p is not None
    how = "fixed" if p.fixed >= 0 else "measured"
    return (
        f"PP-ASGD: served f_S with S = {p.steps} ({how}); running mean staleness S̄ = "
        f"{p.mean.value:.2f}; the paper's eq. (1) S̄ = 1 + F_U/F_G = "
        f"{paper_staleness(a.ts, a.applied, learners):.2f}"
    )
