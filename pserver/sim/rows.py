"""The simulated run's dump rows, kept as tuples and written to ``stats.h5`` in batches.

The groups and columns are those of the dump schema (``pserver.dump.schema``): the writer
refuses any other. A row is one tuple appended to its table (the cheapest thing Python does
per event); rows go to the writer every ``BATCH`` rows of a table, so 10,000 learners cost one
HDF5 append per batch, not one per event.
"""

from __future__ import annotations

from typing import Any

from pserver.dump.writer import StatsWriter

BATCH = 200_000  # rows of one group held before they are appended to the file


class Table:
    """One group's rows, in the order of ``columns``; ``append(row_tuple)``."""

    __slots__ = ("group", "columns", "rows", "append", "sink")

    def __init__(self, sink: Rows, group: str, columns: tuple[str, ...]) -> None:
        self.sink, self.group, self.columns = sink, group, columns
        self.rows: list[tuple[Any, ...]] = []
        self.append = self.rows.append

    def full(self) -> bool:
        return len(self.rows) >= BATCH

    def take(self) -> dict[str, Any]:
        """The rows held, as columns, and forget them."""
        rows, self.rows = self.rows, []
        self.append = self.rows.append
        return {c: list(v) for c, v in zip(self.columns, zip(*rows, strict=True), strict=True)}


class Rows:
    """The tables of a simulated dump, appended to ``writer`` in batches (``close``: the rest)."""

    def __init__(self, writer: StatsWriter) -> None:
        self.writer = writer
        self.tables: dict[str, Table] = {}
        self.clocks: list[tuple[int, ...]] = []

    def table(self, group: str, *columns: str) -> Table:
        """The table of ``group`` with these columns (one per group)."""
        t = self.tables.get(group)
        if t is None:
            t = self.tables[group] = Table(self, group, columns)
        return t

    def train(self) -> Table:
        """The ``train`` rows, one per minibatch (every simulated learner writes them)."""
        return self.table("train", "learner", "step", "time", "loss", "error", "compute_time",
                          "wait_time", "pull_time", "push_time", "stale_fraction",
                          "dropped_blocks")  # fmt: skip

    def staleness(self) -> Table:
        """The ``staleness`` rows, one per applied contribution."""
        return self.table("staleness", "learner", "owner", "version", "staleness", "time")

    def exchanges(self) -> Table:
        """The learners-only strategies' ``exchanges`` rows, one per learner step."""
        return self.table("exchanges", "learner", "step", "partner", "partner_age",
                          "partner_step", "bytes", "wait_time", "time")  # fmt: skip

    def add(self, group: str, **row: Any) -> None:
        """One row by column names (for the rare rows: delays, end-of-run totals)."""
        t = self.table(group, *row)
        t.append(tuple(row[c] for c in t.columns))
        self.check(t)

    def check(self, t: Table) -> None:
        """Write ``t`` out once a batch is full (the callers of ``append`` ask now and then)."""
        if t.full():
            self.write(t)

    def write(self, t: Table) -> None:
        if t.rows:
            self.writer.append(t.group, **t.take())
        if t.group == "updates" and self.clocks:
            self.writer.append_clocks("updates", "vector_clock", self.clocks)
            self.clocks = []

    def close(self) -> None:
        for t in self.tables.values():
            self.write(t)
