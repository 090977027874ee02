"""Which ranks of the job are still running: how a survivor names the peer it lost.

MPICH does not name a dead peer to the survivors. On one node, a survivor that was copying a
payload out of a killed rank's memory gets ``MPI.Exception`` "Other MPI error ...
process_vm_readv failed (errno 3)" (ESRCH, the process is gone) with no rank in it; one that
waits for a small message from the dead rank gets nothing at all and waits until the launcher
kills it. Hydra usually kills the job within milliseconds and prints the dead PID, but a
launcher that does not (a multi-host job, ``srun --kill-on-bad-exit=0``) leaves the survivors
waiting, and a survivor that wins the race prints its own rank as the failed one.

So every rank learns, at start-up, the host, PID and start time of every rank (one allgather
before anything can fail), and a rank that sees an MPI error or waits long asks the kernel
which of the ranks on *its own node* have gone. A rank that finished normally is still running
while any rank of the job has not finalized (``MPI_Finalize`` synchronizes the job in MPICH and
Open MPI), so a rank whose process is gone before we finalize has died. Ranks on other nodes
cannot be checked this way: the report then says that it cannot tell.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    """One rank's process: where it runs, its PID and its start time (clock ticks after boot,
    0 when unknown), which tells a reused PID from the rank's own process."""

    host: str
    pid: int
    start: int = 0


def start_time(pid: int, proc: Path = PROC) -> int | None:
    """Field 22 of ``/proc/PID/stat``; None when the process is gone or a zombie (Linux)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces
    if fields[0] in ("Z", "X"):  # killed but not yet reaped by its parent (Hydra's proxy)
        return None
    return int(fields[19])


def this_process() -> Proc:
    pid = os.getpid()
    return Proc(socket.gethostname(), pid, start_time(pid) or 0)


class Roster:
    """The process of every rank (index = rank), as gathered at start-up."""

    def __init__(self, procs: list[Proc], host: str | None = None, proc: Path = PROC) -> None:
        self.procs = procs
        self.host = socket.gethostname() if host is None else host
        self.proc = proc
        # ranks we can watch: on this host, and visible now (not in another PID namespace)
        self.visible = {
            r for r, p in enumerate(procs) if p.host == self.host and self._running(p)
        }

    def _running(self, p: Proc) -> bool:
        start = start_time(p.pid, self.proc)
        return start is not None and (p.start == 0 or start == p.start)

    def gone(self, rank: int) -> bool | None:
        """True if ``rank``'s process has ended, False if it runs, None if we cannot tell."""
        if rank not in self.visible:
            return None
        return not self._running(self.procs[rank])

    def dead(self) -> list[int]:
        """Ranks on this node whose process has ended."""
        return [r for r in range(len(self.procs)) if self.gone(r)]

    def where(self, rank: int) -> str:
        p = self.procs[rank]
        return f"pid {p.pid} on {p.host}"
