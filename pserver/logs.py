"""Per-rank logging: every line names the rank and its role, as users of mpiexec expect."""

from __future__ import annotations

import logging
import socket
import sys


def setup_logging(rank: int, role: str, level: str = "info") -> logging.Logger:
    log = logging.getLogger("pserver")
    log.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    host = socket.gethostname()
    fmt = f"%(asctime)s.%(msecs)03d [rank {rank} {role} @{host}] %(levelname)s %(message)s"
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
    return log
