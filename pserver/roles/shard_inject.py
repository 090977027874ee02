"""Injected faults at a shard (``inject``): delayed pull replies and a straggler shard.

A rare, large delay of one reply (PSP-SGD §4.2): the pull waits in a heap until it is due, and
the shard's loop wakes for it (``due``). The draw is a pure function of (seed, shard, learner,
request index), so a run's delays are reproducible.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterable

from pserver.comm.wire import Header
from pserver.plan.inject import InjectPlan


class ShardInjection:
    def __init__(self, plan: InjectPlan, shard: int, peers: Iterable[int]) -> None:
        self.plan, self.shard = plan, shard
        self.pulls = dict.fromkeys(peers, 0)  # pull requests per peer (delay draws)
        self.delayed: list[tuple[float, int, Header]] = []  # heap of replies held back
        self.sequence = itertools.count()

    def delay(self, h: Header, learner: int, now: float) -> tuple[int, float]:
        """(request index, seconds) for the pull ``h``; a delayed pull is kept until due."""
        request = self.pulls[h.sender]
        self.pulls[h.sender] += 1
        delay = self.plan.pull_delay_for(self.shard, learner, request)
        if delay > 0.0:
            heapq.heappush(self.delayed, (now + delay, next(self.sequence), h))
        return request, delay

    def due(self) -> float | None:
        """When the earliest delayed pull is due, or None."""
        return self.delayed[0][0] if self.delayed else None

    def released(self, now: float) -> list[Header]:
        """The delayed pulls due by ``now``, in order."""
        out = []
        while self.delayed and self.delayed[0][0] <= now:
            out.append(heapq.heappop(self.delayed)[2])
        return out

    def withdraw(self, sender: int, block: int) -> list[Header]:
        """Take back ``sender``'s delayed pulls of ``block`` (it left: answered at once)."""
        mine = [e for e in self.delayed if e[2].sender == sender and e[2].block == block]
        if mine:
            self.delayed = [e for e in self.delayed if e not in mine]
            heapq.heapify(self.delayed)
        return [e[2] for e in mine]

    def slow_down(self, elapsed: float) -> None:
        """Straggler shard: stretch the handling time by ``inject.server_factor``."""
        factor = self.plan.server_slowdown(self.shard)
        if factor > 1.0:
            time.sleep((factor - 1.0) * elapsed)
