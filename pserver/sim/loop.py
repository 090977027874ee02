"""The event loops a simulation runs on: SimPy's, or a minimal heap of callbacks.

Both offer the same three calls: ``now``, ``after(delay, fn, *args)`` (run ``fn(*args)`` at
``now + delay``) and ``run()`` (until no event is left). Events due at the same time run in
the order they were scheduled, in both loops, so a simulation gives the same dump on either.
The simulation is written as callbacks rather than SimPy processes: a process costs a generator
switch per event on top of the callback (docs/simulation.md, *Event loop*, has the figures).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

LOOPS = ("heap", "simpy")


class HeapLoop:
    """Callbacks in a binary heap keyed by (time, sequence number)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (self.now + delay, next(self._seq), fn, args))

    def run(self) -> None:
        heap, pop = self._heap, heapq.heappop
        n = 0
        while heap:
            self.now, _, fn, args = pop(heap)
            fn(*args)
            n += 1
        self.events += n


class SimpyLoop:
    """The same calls on a ``simpy.Environment`` (a timeout event whose callback runs ``fn``)."""

    def __init__(self) -> None:
        import simpy

        self.env = simpy.Environment()
        self.events = 0

    @property
    def now(self) -> float:
        return float(self.env.now)

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _ev: fn(*args))

    def run(self) -> None:
        env = self.env
        n = 0
        try:
            while True:
                env.step()
                n += 1
        except Exception as e:  # simpy.core.EmptySchedule ends the run
            if type(e).__name__ != "EmptySchedule":
                raise
        self.events += n


def make_loop(name: str) -> HeapLoop | SimpyLoop:
    """The loop ``sim.loop`` names (``"heap"`` or ``"simpy"``)."""
    if name == "simpy":
        return SimpyLoop()
    if name == "heap":
        return HeapLoop()
    raise ValueError(f"event loop {name!r}: expected one of {LOOPS}")
