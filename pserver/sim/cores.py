"""The node's cores as an egalitarian processor-sharing queue (``sim.cores``).

Every simulated rank that computes or serves (a learner's model compute and step, the shard's
handling of a message, the statistics server's rows) hands its CPU seconds to :class:`Cores`:
with ``runnable`` jobs on ``cores`` processors each job runs at rate ``min(1, cores /
runnable)``, so a job of ``c`` CPU seconds takes ``c × max(1, runnable / cores)`` of wall time
while the load stays the same, and its rate changes whenever a job starts or ends (processor
sharing as the operating system's scheduler approximates it: Kleinrock, *Queueing Systems*
vol. 2, §4.4, the M/G/1 processor-sharing queue, here with ``cores`` servers).

Egalitarian sharing gives every running job the same rate, so one *virtual clock* ``v`` (the CPU
seconds each running job has received since the start, ``dv/dt = min(1, cores / runnable)``)
orders all completions: a job of ``c`` started when the clock read ``v0`` ends when it reads
``v0 + c``. The jobs sit in a heap by that reading; a start or an end moves the clock to now,
changes the rate and schedules one event for the earliest end. The event loop cannot cancel an
event, so each scheduled end carries a generation number and a superseded one does nothing: a
start or an end costs O(log jobs) and one event, whatever the number of jobs.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

#: a job's end within this share of its CPU time of the clock's reading counts as reached
#: (the clock advances by sums of floats)
EPS = 1e-9


class Cores:
    """``cores`` processors shared by the jobs of ``run``; ``loop`` is the simulation's loop."""

    def __init__(self, loop: Any, cores: float) -> None:
        if cores <= 0:
            raise ValueError(f"cores = {cores}: a processor-sharing queue needs cores > 0")
        self.loop, self.cores = loop, float(cores)
        self.virtual = 0.0  # CPU s each running job has received since the start
        self.since = 0.0  # loop time the virtual clock was last moved to
        self.jobs: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = itertools.count()
        self.generation = 0
        self.cpu = 0.0  # CPU s handed out in all (the busy cores' integral)
        self.peak = 0  # the most jobs runnable at once

    @property
    def runnable(self) -> int:
        return len(self.jobs)

    def rate(self) -> float:
        """CPU s per wall s each running job gets now."""
        n = len(self.jobs)
        return min(1.0, self.cores / n) if n else 1.0

    def run(self, cpu: float, fn: Callable[..., None], *args: Any) -> None:
        """Run a job of ``cpu`` CPU seconds; ``fn(*args)`` when it has had them."""
        self.advance()
        self.cpu += cpu
        heapq.heappush(self.jobs, (self.virtual + max(cpu, 0.0), next(self.seq), fn, args))
        self.peak = max(self.peak, len(self.jobs))
        self.schedule()

    def advance(self) -> None:
        now = self.loop.now
        if now > self.since:
            self.virtual += (now - self.since) * self.rate()
            self.since = now

    def schedule(self) -> None:
        """One event at the earliest end at the present rate; earlier ones are superseded."""
        self.generation += 1
        if self.jobs:
            left = (self.jobs[0][0] - self.virtual) / self.rate()
            self.loop.after(max(left, 0.0), self.due, self.generation)

    def due(self, generation: int) -> None:
        if generation != self.generation:
            return  # a job started or ended since this was scheduled: a later event stands
        self.advance()
        done = []
        jobs, reached = self.jobs, self.virtual + EPS * max(1.0, abs(self.virtual))
        while jobs and jobs[0][0] <= reached:
            done.append(heapq.heappop(jobs))
        self.schedule()
        for _, _, fn, args in done:  # in the order they were started, for equal ends
            fn(*args)


class Serial:
    """One rank's work as a FIFO of CPU jobs on :class:`Cores` (the statistics server: it takes
    its rows one batch at a time)."""

    def __init__(self, cores: Cores) -> None:
        self.cores = cores
        self.queue: deque[float] = deque()
        self.busy = False

    def submit(self, cpu: float) -> None:
        if cpu <= 0.0:
            return
        self.queue.append(cpu)
        if not self.busy:
            self.next()

    def next(self) -> None:
        self.busy = bool(self.queue)
        if self.busy:
            self.cores.run(self.queue.popleft(), self.next)
