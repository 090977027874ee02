"""The simulated run's dump rows, kept as columns and written to ``stats.h5`` in batches.

The groups and columns are those of the dump schema (``pserver.dump.schema``): the writer
refuses any other. Rows go to the writer every ``BATCH`` rows of a group, so 10,000 learners
cost one HDF5 append per batch, not one per event.
"""

from __future__ import annotations

from typing import Any

from pserver.dump.writer import StatsWriter

BATCH = 200_000  # rows of one group held before they are appended to the file


class Rows:
    """Column buffers per group, appended to ``writer`` in batches (``close`` writes the rest)."""

    def __init__(self, writer: StatsWriter) -> None:
        self.writer = writer
        self.groups: dict[str, dict[str, list[Any]]] = {}
        self.clocks: list[tuple[int, ...]] = []
        self.counts: dict[str, int] = {}

    def add(self, group: str, **row: Any) -> None:
        cols = self.groups.get(group)
        if cols is None:
            cols = self.groups[group] = {name: [] for name in row}
        for name, value in row.items():
            cols[name].append(value)
        self.counts[group] = self.counts.get(group, 0) + 1
        if len(next(iter(cols.values()))) >= BATCH:
            self.write(group)

    def add_clock(self, clock: tuple[int, ...]) -> None:
        """The vector clock of the ``updates`` row added just before."""
        self.clocks.append(clock)

    def write(self, group: str) -> None:
        cols = self.groups.pop(group, None)
        if cols:
            self.writer.append(group, **cols)
        if group == "updates" and self.clocks:
            self.writer.append_clocks("updates", "vector_clock", self.clocks)
            self.clocks = []

    def close(self) -> None:
        for group in list(self.groups):
            self.write(group)
