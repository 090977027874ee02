"""Statistics rows buffered on a rank and shipped one-way to the statistics server.

Rows are small scalars (timestamps, losses, timings), so they travel as a pickled dict of lists:
control data, never array payloads. They are batched and sent every ``interval`` seconds so the
statistics traffic stays negligible next to the model traffic.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from mpi4py import MPI

from pserver.wire import Tag


class RecordBuffer:
    def __init__(self, comm: MPI.Comm, stats_rank: int, interval: float) -> None:
        self.comm, self.stats_rank, self.interval = comm, stats_rank, interval
        self._rows: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        self._clocks: list[list[int]] = []
        self._last = time.monotonic()
        # A role's buffer is made as the role starts: its end-of-run row reports what the
        # process burnt from here on (every thread: comm, I/O and waiting included).
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()

    def add(self, group: str, **row: Any) -> None:
        cols = self._rows[group]
        for key, value in row.items():
            cols[key].append(value)

    def usage(self) -> dict[str, float]:
        """``cpu_time`` (CPU seconds of the whole process) and ``run_time`` (wall seconds) since
        this buffer was made: ``cpu_time / run_time`` is the share of a core the rank used, the
        figure that shows a waiting rank does not spin."""
        return {
            "cpu_time": time.process_time() - self._cpu0,
            "run_time": time.perf_counter() - self._wall0,
        }

    def add_clock(self, clock: tuple[int, ...]) -> None:
        """The vector clock of an update, shipped with the ``updates`` row added alongside."""
        self._clocks.append(list(clock))

    def maybe_send(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.send()

    def send(self) -> None:
        self._last = time.monotonic()
        if not self._rows and not self._clocks:
            return
        payload = {g: dict(cols) for g, cols in self._rows.items()}
        if self._clocks:
            payload["__clocks__"] = self._clocks
        self.comm.send(payload, dest=self.stats_rank, tag=Tag.RECORDS)
        self._rows.clear()
        self._clocks = []
