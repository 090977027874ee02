"""Naming a dead peer: the roster of processes, and the Waiter's PeerLost (one process)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import pytest
from mpi4py import MPI

from pserver.comm.liveness import Proc, Roster, start_time, this_process
from pserver.comm.waiting import PeerLog, Waiter, mpi_error_summary
from pserver.errors import PeerLost

# what a learner got from MPICH 5.0.2 (PyPI wheel) when its shard was killed with SIGKILL
MPICH_DEAD_PEER = """Other MPI error, error stack:
internal_Test(109).....: MPI_Test(request=0x7fc2b14c9b50, flag=0x7ffcf0727a90, status=0x7fc2b1513670) failed
MPIDI_IPC_rndv_cb(176).: 
MPIDI_CMA_copy_data(68): 
copy_iovs(224).........: process_vm_readv failed (errno 3)"""  # noqa: E501, W291

linux = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")


def child() -> subprocess.Popen:
    """A process that runs until its stdin closes."""
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )


def roster_with(proc: subprocess.Popen) -> Roster:
    pid = proc.pid
    return Roster([this_process(), Proc(socket.gethostname(), pid, start_time(pid) or 0)])


@linux
def test_a_reaped_or_zombie_peer_is_gone_a_running_one_is_not():
    for reap in (True, False):
        p = child()
        roster = roster_with(p)
        assert roster.gone(1) is False and roster.dead() == []
        p.kill()
        if reap:
            p.wait()
        else:  # killed, not yet reaped by its parent: a zombie, as under Hydra's proxy
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
        assert roster.gone(1) is True and roster.dead() == [1]
        p.wait()


def test_ranks_that_cannot_be_checked_are_unknown_not_dead():
    me = this_process()
    other_host = Proc(me.host + "-elsewhere", me.pid, me.start)
    reused_pid = Proc(me.host, me.pid, me.start + 1)  # same pid, another process's start time
    roster = Roster([me, other_host, reused_pid])
    assert roster.gone(1) is None and roster.gone(2) is None
    assert roster.dead() == []


def test_mpich_error_stack_in_one_line():
    assert mpi_error_summary(Exception(MPICH_DEAD_PEER)) == (
        "Other MPI error: process_vm_readv failed (errno 3)"
    )


def test_mpi_error_while_waiting_names_what_was_awaited():
    peers = PeerLog(names=lambda r: f"server {r}")

    def failing() -> bool:
        raise MPI.Exception(MPI.ERR_OTHER)

    waiter = Waiter(logging.getLogger("test"), peers)
    with pytest.raises(PeerLost, match="got an MPI error while waiting for weights of") as e:
        waiter.until(failing, "weights of block 0")
    assert not e.value.named  # no dead rank found: the traceback will be printed too


@linux
def test_wait_on_a_dead_peer_ends_naming_it():
    p = child()
    peers = PeerLog(roster_with(p), names=lambda r: "server 0" if r == 1 else "learner 0")
    p.kill()
    p.wait()
    waiter = Waiter(logging.getLogger("test"), peers, 1e-5, 1e-3, 60.0)
    with pytest.raises(PeerLost) as info:
        waiter.until(lambda: False, "weights of blocks [0]")  # never true: only the check ends it
    text = str(info.value)
    assert info.value.named
    assert f"lost rank 1 (server 0, pid {p.pid} on {socket.gethostname()})" in text
    assert "it failed first while waiting for weights of blocks [0]" in text


@linux
def test_the_periodic_check_polls_pidfds_and_reads_no_proc_file(monkeypatch):
    """A wait asks every LIVENESS_PERIOD: with pidfds the answer reads no /proc file (reading
    one per rank of the node was O(N²) per node, docs/performance.md)."""
    import pserver.comm.liveness as liveness

    if not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open here (Linux 5.3+, Python 3.9+)")
    p = child()
    roster = roster_with(p)
    assert roster.dead() == []  # opens the pidfds

    def no_proc(*_a, **_k):
        raise AssertionError("read /proc although a pidfd watches the rank")

    monkeypatch.setattr(liveness, "start_time", no_proc)
    assert roster.dead() == [] and roster.gone(1) is False
    p.kill()
    p.wait()
    assert roster.dead() == [1] and roster.gone(1) is True


@linux
def test_without_pidfds_the_roster_reads_proc(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    p = child()
    roster = roster_with(p)
    assert roster.dead() == []
    p.kill()
    p.wait()
    assert roster.dead() == [1] and roster.gone(1) is True
