"""The data server of a learners-only run, simulated: it ends the run, as in a real one.

A learners-only strategy (SYNC, HYBRID, ADPSGD) has no shard to count the samples: the data
server decides, request by request, whether to serve a minibatch or answer with the stop
(``pserver.roles.dataserver``). The decision here is that same object's,
``pserver.protocols.lockstep.DataQuota`` (SYNC's quota gives each learner its ``S`` steps,
ADPSGD's free one serves while the run's count is below ``M``), asked in the order the requests
reach the server (the event loop's time order). The timing is ``pserver.sim.learner.DataServer``'s
FIFO queue of ``sim.data_time`` per minibatch.

A learner's prefetcher (``pserver.roles.prefetch``) holds ``data.prefetch`` slots: at start it
asks for that many minibatches, and one more each time the learner releases the slot of the
minibatch it computed on (``Trainer.step``: after the compute, before the exchange); after the
server's stop it asks for nothing more.
"""

from __future__ import annotations

from collections import deque

from pserver.protocols.lockstep import DataQuota
from pserver.sim.learner import DataServer


class Feed:
    """The data server's decisions and times for ``n_learners`` prefetchers."""

    def __init__(self, quota: DataQuota, server: DataServer, prefetch: int, n_learners: int):
        self.quota, self.server, self.prefetch = quota, server, max(1, prefetch)
        self.slots: list[deque[tuple[float, bool]]] = [deque() for _ in range(n_learners)]
        self.over = [False] * n_learners  # the server's stop was served to this learner

    def open(self, learner: int, now: float) -> None:
        """The prefetcher starts: ``data.prefetch`` requests."""
        for _ in range(self.prefetch):
            self.ask(learner, now)

    def ask(self, learner: int, now: float) -> None:
        if self.over[learner]:
            return  # the prefetch thread ends after the stop
        ok = self.quota.allows(learner)
        self.over[learner] = not ok
        self.slots[learner].append((self.server.request(now), ok))

    def take(self, learner: int) -> tuple[float, bool]:
        """(when it is ready, whether it is a minibatch: False is the stop) of the next one."""
        return self.slots[learner].popleft()

    def release(self, learner: int, now: float) -> None:
        """The learner is done with a minibatch: its slot asks for the next one."""
        self.ask(learner, now)
