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

Every wait asks once per ``LIVENESS_PERIOD`` (``pserver.comm.waiting``), so the question must
cost little: reading ``/proc/PID/stat`` of every rank of the node made it O(N) file reads per
rank per period, O(N²) per node, which at 131 ranks on two cores took two thirds of an idle
learner's CPU (docs/performance.md, *Issue 26, third pass*). Where Linux offers
``pidfd_open`` (5.3+), the roster holds a descriptor per rank of the node, opened once, and
one ``poll`` with no timeout tells which have exited (a zombie included; a reused PID cannot
fool a pidfd); elsewhere, or past the process's descriptor limit, it reads ``/proc``.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
#: descriptors a roster leaves free for the rest of the process (MPI, files, the dump)
FD_RESERVE = 256


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
        self._fds: dict[int, int] | None = None  # rank -> pidfd, opened at the first question
        self._fd_rank: dict[int, int] = {}
        self._poll: select.poll | None = None
        self._exited: set[int] = set()  # ranks found gone when their pidfd was to be opened
        # a learner's prefetch thread and its main thread ask at once: one poll object
        # refuses concurrent calls, and the descriptors are opened once
        self._lock = threading.Lock()

    def _running(self, p: Proc) -> bool:
        start = start_time(p.pid, self.proc)
        return start is not None and (p.start == 0 or start == p.start)

    def _watch(self) -> dict[int, int]:
        """Open a pidfd per visible rank (once); ranks without one are read from /proc."""
        with self._lock:
            if self._fds is None:
                self._open()
            assert self._fds is not None
            return self._fds

    def _open(self) -> None:
        self._fds = {}
        opener = getattr(os, "pidfd_open", None)
        if opener is None or self.proc != PROC:  # not Linux 5.3+, or a test's fake /proc
            return
        budget = _fd_budget()
        me = os.getpid()
        for r in sorted(self.visible):
            p = self.procs[r]
            if p.pid == me or len(self._fds) >= budget:
                continue
            try:
                fd = opener(p.pid)
            except ProcessLookupError:
                self._exited.add(r)
                continue
            except OSError:  # no pidfds here (seccomp, EMFILE): this rank stays on /proc
                break
            if not self._running(p):  # the PID was reused before we opened it: it is gone
                os.close(fd)
                self._exited.add(r)
                continue
            self._fds[r] = fd
        self._fd_rank = {fd: r for r, fd in self._fds.items()}
        if self._fds:
            self._poll = select.poll()
            for fd in self._fds.values():
                self._poll.register(fd, select.POLLIN)
            weakref.finalize(self, _close_all, list(self._fds.values()))

    def gone(self, rank: int) -> bool | None:
        """True if ``rank``'s process has ended, False if it runs, None if we cannot tell."""
        if rank not in self.visible:
            return None
        fds = self._watch()
        if rank in self._exited:
            return True
        if rank in fds:
            one = select.poll()  # not select(): a descriptor may be past FD_SETSIZE
            one.register(fds[rank], select.POLLIN)
            return bool(one.poll(0))
        return not self._running(self.procs[rank])

    def dead(self) -> list[int]:
        """Ranks on this node whose process has ended: one ``poll`` over the pidfds, the rest
        (no pidfd) read from /proc."""
        fds = self._watch()
        out = set(self._exited)
        if self._poll is not None:
            with self._lock:
                ready = self._poll.poll(0)
            out.update(self._fd_rank[fd] for fd, _ in ready)
        me = os.getpid()
        out.update(r for r in self.visible - fds.keys() - out
                   if self.procs[r].pid != me and self.gone(r))  # fmt: skip
        return sorted(out)

    def where(self, rank: int) -> str:
        p = self.procs[rank]
        return f"pid {p.pid} on {p.host}"


def _fd_budget() -> int:
    """How many pidfds a roster may open: the soft descriptor limit less ``FD_RESERVE``."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(soft - FD_RESERVE, 0)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
