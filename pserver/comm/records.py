"""Statistics rows buffered on a rank and shipped one-way to the statistics server.

Rows are small scalars (timestamps, losses, timings). They are batched and sent every
``interval`` seconds so the statistics traffic stays negligible next to the model traffic.

Statistics are off the critical path: a rank never waits for the statistics server while it
trains. A batch is encoded to JSON bytes here (:func:`encode`; a safe format, nothing is
unpickled) and goes by a non-blocking synchronous send (``Issend``); at most ``MAX_SENDS``
batches are in flight. Synchronous, because a plain ``Isend`` of a small message completes as
soon as MPI has copied it into its eager buffers: against a stopped statistics server the
batches then pile up there, and MPICH's shared-memory transport draws every destination's
eager messages from one pool of cells per rank, so once the statistics traffic has taken them
all the rank's gradients and weights stop too (a 10 s SIGSTOP of the statistics server paused
quickstart updates for 4.6 s that way). An ``Issend`` completes only once the statistics
server has matched it, so the bound on batches in flight also bounds the cells they hold.
The rows held by a rank, buffered or in flight, are bounded by ``max_rows``
(``stats.buffer_rows``): while the statistics server lags so far behind, new rows are dropped,
counted per group, logged (once when it starts, once with the counts at the end) and reported
with every batch, so the dump says how many rows each rank lost (``dropped_records``, see
docs/stats.md). Only :meth:`RecordBuffer.close` at the end of the run waits for the
statistics server, through the waiter, whose stall report names what it waits for.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from typing import Any

from mpi4py import MPI

from pserver.comm.doorbell import ring
from pserver.comm.waiting import Waiter
from pserver.comm.wire import Tag

MAX_SENDS = 4  # batches in flight per rank; more are held as rows (and counted in max_rows)
DEFAULT_MAX_ROWS = 50_000  # ~10 values a row, ~32 B a value in lists: ~16 MB held at most
ROWS, CLOCKS, DROPPED = "rows", "clocks", "dropped"
#: end-of-run totals, one row per rank or block: never dropped (they are what the summary reads)
TOTALS = frozenset({"learners", "servers", "blocks", "aggregators"})


class RecordError(ValueError):
    """A statistics batch that does not decode to the documented structure."""


def _scalar(value: Any) -> Any:
    """JSON fallback for NumPy scalars (``np.int64`` is not an ``int``)."""
    item = getattr(value, "item", None)
    if item is None:
        raise TypeError(f"statistics value {value!r} is not a number")
    return item()


def encode(rows: dict[str, dict[str, list[Any]]], clocks: list[list[int]],
           dropped: dict[str, int]) -> bytes:
    """One batch as UTF-8 JSON: ``{"rows": {group: {column: [values]}}, "clocks": [[...]],
    "dropped": {group: count}}``. NaN and infinities travel as JSON's ``NaN``/``Infinity``
    extensions (Python reads them back); floats round-trip exactly (shortest repr)."""
    payload = {ROWS: rows, CLOCKS: clocks, DROPPED: dropped}
    return json.dumps(payload, separators=(",", ":"), default=_scalar).encode()


def decode(data: bytes | bytearray | memoryview) -> tuple[
    dict[str, dict[str, list[Any]]], list[list[int]], dict[str, int]
]:
    """Inverse of :func:`encode`; raises :class:`RecordError` on anything else."""
    try:
        payload = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"statistics batch is not JSON: {exc}") from None
    if not isinstance(payload, dict) or set(payload) != {ROWS, CLOCKS, DROPPED}:
        raise RecordError("statistics batch lacks its rows, clocks or dropped counts")
    rows, clocks, dropped = payload[ROWS], payload[CLOCKS], payload[DROPPED]
    if not isinstance(rows, dict) or not all(
        isinstance(cols, dict) and all(isinstance(v, list) for v in cols.values())
        for cols in rows.values()
    ):
        raise RecordError("statistics rows must be {group: {column: [values]}}")
    if not isinstance(clocks, list) or not all(isinstance(c, list) for c in clocks):
        raise RecordError("statistics clocks must be a list of lists")
    if not isinstance(dropped, dict) or not all(
        isinstance(n, int) and n >= 0 for n in dropped.values()
    ):
        raise RecordError("statistics dropped counts must be {group: count >= 0}")
    return rows, clocks, dropped


class RowBudget:
    """Pure bookkeeping of the bounded buffer: rows held (buffered + in flight), rows dropped.

    ``take()`` says whether one more row fits; a row that does not is counted as dropped under
    its group. ``release(n)`` gives back the rows of a batch the statistics server received.
    The end-of-run totals (``TOTALS``) always fit: a few rows more than the bound.
    """

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.held = 0
        self.dropped: dict[str, int] = {}

    def take(self, group: str) -> bool:
        if self.held >= self.max_rows and group not in TOTALS:
            self.dropped[group] = self.dropped.get(group, 0) + 1
            return False
        self.held += 1
        return True

    def release(self, n: int) -> None:
        self.held -= n

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())


class RecordBuffer:
    def __init__(
        self,
        comm: MPI.Comm,
        stats_rank: int,
        interval: float,
        max_rows: int = DEFAULT_MAX_ROWS,
        log: logging.Logger | None = None,
    ) -> None:
        self.comm, self.stats_rank, self.interval = comm, stats_rank, interval
        self.log = log or logging.getLogger("pserver.records")
        self.budget = RowBudget(max_rows)
        self._rows: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        self._clocks: list[list[int]] = []
        self._n_rows = 0  # rows in ``_rows`` (a group's row is one ``add``)
        self._clock_dropped = False  # the last ``updates`` row was dropped: so is its clock
        # batches in flight: (request, encoded bytes the request reads, rows it carries)
        self._sending: list[tuple[MPI.Request, bytes, int]] = []
        self._last = time.monotonic()
        # A role's buffer is made as the role starts: its end-of-run row reports what the
        # process burnt from here on (every thread: comm, I/O and waiting included).
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()

    def add(self, group: str, **row: Any) -> None:
        """Buffer one row of ``group``; dropped (and counted) when the buffer is full."""
        if not self.budget.take(group):
            if self.budget.total_dropped == 1:
                self.log.warning(
                    "statistics buffer full (%d rows held for the statistics server, "
                    "stats.buffer_rows): dropping rows until it catches up; the dump counts "
                    "them under dropped_records",
                    self.budget.max_rows,
                )
            if group == "updates":
                self._clock_dropped = True
            return
        if group == "updates":
            self._clock_dropped = False
        cols = self._rows[group]
        for key, value in row.items():
            cols[key].append(value)
        self._n_rows += 1

    def usage(self) -> dict[str, float]:
        """``cpu_time`` (CPU seconds of the whole process) and ``run_time`` (wall seconds) since
        this buffer was made: ``cpu_time / run_time`` is the share of a core the rank used, the
        figure that shows a waiting rank does not spin."""
        return {
            "cpu_time": time.process_time() - self._cpu0,
            "run_time": time.perf_counter() - self._wall0,
        }

    def add_clock(self, clock: tuple[int, ...]) -> None:
        """The vector clock of the ``updates`` row added just before (dropped with that row)."""
        if not self._clock_dropped:
            self._clocks.append(list(clock))

    def maybe_send(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.send()

    def send(self) -> None:
        """Ship the buffered rows if a send slot is free; never waits for the statistics server.

        With ``MAX_SENDS`` batches still in flight the rows stay buffered (they count against
        ``max_rows``) and go with a later call.
        """
        self._last = time.monotonic()
        self._reap()
        if len(self._sending) < MAX_SENDS:
            self._post()

    def pending(self) -> int:
        """Batches in flight, not yet taken by the statistics server."""
        self._reap()
        return len(self._sending)

    def close(self, waiter: Waiter) -> None:
        """End of the run: ship every buffered row and wait until the statistics server has
        taken all of them (the dump must be complete); the waiter reports a stall."""
        self._reap()
        self._post(force=bool(self.budget.dropped))  # the final counts go in any case
        reqs = [req for req, _, _ in self._sending]
        # no doorbell here: a batch larger than MPI's eager cells moves only while this rank
        # calls MPI, so this wait must keep testing (pserver.comm.doorbell)
        waiter.waitall(reqs, "the statistics server to take this rank's last statistics rows")
        self._reap()
        dropped = self.budget.dropped
        if dropped:
            self.log.warning(
                "dropped %d statistics rows (%s) while the statistics server lagged behind "
                "(stats.buffer_rows = %d); the dump counts them under dropped_records",
                self.budget.total_dropped,
                ", ".join(f"{g}: {n}" for g, n in sorted(dropped.items())),
                self.budget.max_rows,
            )

    def bye(self, header: Any, tag: int, waiter: Waiter) -> None:
        """The rank's last message to the statistics server, after :meth:`close`: a
        non-blocking send waited for with a stall report (MPICH's blocking ``Send`` spins)."""
        req = self.comm.Isend(header, dest=self.stats_rank, tag=tag)
        ring(self.stats_rank)  # the statistics server sleeps on its doorbell
        waiter.wait(req, "the statistics server to take this rank's goodbye",
                    rung_by=(self.stats_rank,))  # StatsServer.on_bye rings  # fmt: skip

    def _post(self, force: bool = False) -> None:
        if not self._n_rows and not self._clocks and not force:
            return
        rows = {g: dict(cols) for g, cols in self._rows.items()}
        data = encode(rows, self._clocks, dict(self.budget.dropped))
        req = self.comm.Issend([data, MPI.BYTE], dest=self.stats_rank, tag=Tag.RECORDS)
        ring(self.stats_rank)  # the statistics server sleeps on its doorbell
        self._sending.append((req, data, self._n_rows))
        self._rows.clear()
        self._clocks = []
        self._n_rows = 0

    def _reap(self) -> None:
        """Forget the batches the statistics server received; their rows leave the budget."""
        still = []
        for sending in self._sending:  # at most MAX_SENDS: one Test each is cheap
            if sending[0].Test():
                self.budget.release(sending[2])
            else:
                still.append(sending)
        self._sending = still
