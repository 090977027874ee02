"""How long a rank spends in each phase of its life, one log line per phase.

A study of hundreds of short runs pays a job's start-up and shutdown hundreds of times, so
each rank says where its time went before and after training (``scripts/bench_startup.py``
reads these lines; docs/performance.md, *A job's start-up*, has the figures):

    phase imports: 0.412 s wall, 0.380 s CPU (since the process started)

The first phase counts from the process's own start (``/proc/self/stat``), so the
interpreter's start and the imports before ``main`` are in it; without ``/proc`` it counts
from this module's import.
"""

from __future__ import annotations

import logging
import os
import time

PREFIX = "phase "  # what scripts/bench_startup.py looks for in a rank's log


def process_start() -> float:
    """When this process started, on ``time.time()``'s clock (Linux ``/proc``; else now)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # the command name (field 2) may hold spaces: count fields after its ')'
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        started = float(fields[19]) / ticks  # field 22 (starttime): seconds after boot
        return time.time() - (uptime - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class Phases:
    """The wall and CPU time of each phase of a rank; ``mark(name)`` ends the phase ``name``
    (begun where the last one ended) and logs it at ``level`` once a logger is set."""

    def __init__(self, start: float | None = None) -> None:
        self.last = process_start() if start is None else start
        self.cpu = 0.0 if start is None else time.process_time()  # CPU counts from 0 at exec
        self.done: list[tuple[str, float, float]] = []
        self.log: logging.Logger | None = None
        self.level = logging.DEBUG

    def mark(self, name: str) -> None:
        """The phase ``name`` has just ended."""
        now, cpu = time.time(), time.process_time()
        self.done.append((name, now - self.last, cpu - self.cpu))
        self.last, self.cpu = now, cpu
        if self.log is not None:
            self._emit(self.done[-1])

    def attach(self, log: logging.Logger, level: int = logging.DEBUG) -> None:
        """Log with ``log`` from now on, the phases already ended first."""
        self.log, self.level = log, level
        for item in self.done:
            self._emit(item)

    def _emit(self, item: tuple[str, float, float]) -> None:
        assert self.log is not None
        name, wall, cpu = item
        self.log.log(self.level, "%s%s: %.3f s wall, %.3f s CPU", PREFIX, name, wall, cpu)


PHASES = Phases()  # this process's: the CLI marks it, from the module's import on
