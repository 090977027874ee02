"""Doorbells (``pserver.comm.doorbell``) and the waits that sleep on them; learners as batch
tasks (``pserver.comm.crowd``). One process, except the futex across processes (MPI)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from pserver.comm.backoff import Backoff
from pserver.comm.doorbell import futex_call
from pserver.comm.waiting import PeerLog, Waiter
from tests.mpirun import run_job, run_program

CEILING = 30.0  # the back-off's ceiling in these tests: only a ring can end a sleep in time


class FakeBells:
    """The Doorbells interface on a condition variable; records every sleep and how it ended."""

    def __init__(self, ranks: set[int]) -> None:
        self.ranks, self.value = ranks, 0
        self.cond = threading.Condition()
        self.sleeps: list[tuple[float, str]] = []  # (timeout asked, "rung" | "timeout")
        self.asleep = threading.Event()

    def covers(self, ranks) -> bool:  # noqa: ANN001
        return all(r in self.ranks for r in ranks)

    def seen(self) -> int:
        with self.cond:
            return self.value

    def ring(self, rank: int) -> None:
        with self.cond:
            self.value += 1
            self.cond.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        with self.cond:
            self.asleep.set()
            rung = self.cond.wait_for(lambda: self.value != seen, timeout)
        self.sleeps.append((timeout, "rung" if rung else "timeout"))


def waiter_with(bells: FakeBells | None) -> Waiter:
    peers = PeerLog()
    peers.bells = bells  # type: ignore[assignment]
    # one test before the first sleep, every sleep the ceiling: a wait that ends in time was
    # ended by a ring
    return Waiter(logging.getLogger("test"), peers, CEILING, CEILING, 600.0, spin=1)


def test_a_wait_rung_by_its_peer_sleeps_until_the_ring():
    bells = FakeBells({0, 1})
    waiter = waiter_with(bells)
    done = threading.Event()

    def peer() -> None:
        assert bells.asleep.wait(60.0)  # the waiter sleeps on its doorbell
        done.set()  # the reply is there ...
        bells.ring(1)  # ... and the sender rings

    threading.Thread(target=peer, daemon=True).start()
    waiter.until(done.is_set, "the peer's reply", rung_by=(0,))
    assert [how for _, how in bells.sleeps] == ["rung"]
    assert bells.sleeps[0][0] == CEILING  # no ramp of short sleeps before it


def test_a_ring_before_the_sleep_is_not_missed():
    """The counter is read before the test: a ring between the test and the sleep ends the
    sleep at once."""
    bells = FakeBells({0, 1})
    waiter = waiter_with(bells)
    state = {"tests": 0}

    def done() -> bool:
        state["tests"] += 1
        if state["tests"] == 2:  # the peer's message lands right after this failed test
            bells.ring(1)
        return state["tests"] >= 3

    waiter.until(done, "a reply", rung_by=(0,))
    assert [how for _, how in bells.sleeps] == ["rung"]


def test_no_doorbell_for_a_peer_elsewhere_or_a_rank_with_sends_in_flight():
    for rung_by, quiet in (((0, 7), None), ((0,), lambda: False)):
        bells = FakeBells({0, 1})  # rank 7 is on another node: it cannot ring
        waiter = Waiter(logging.getLogger("test"), PeerLog(), 1e-4, 1e-3, 600.0, spin=1)
        waiter.peers.bells = bells  # type: ignore[assignment]
        n = {"tests": 0}

        def done(n: dict = n) -> bool:
            n["tests"] += 1
            return n["tests"] > 5

        waiter.until(done, "a reply", rung_by=rung_by, quiet=quiet)
        assert bells.sleeps == []  # backed off as without doorbells


def test_the_ceiling_is_the_back_off_s_longest_sleep():
    clock = {"t": 0.0}
    b = Backoff(1e-5, 0.02, long=0.1, clock=lambda: clock["t"])
    assert b.ceiling() == 0.02
    clock["t"] = 0.2  # idle past LONG_WAIT
    assert b.ceiling() == 0.1


def test_a_learner_becomes_a_batch_task():
    if not hasattr(os, "SCHED_BATCH"):
        pytest.skip("no SCHED_BATCH here (not Linux)")
    code = textwrap.dedent("""
        import logging, os, threading
        from pserver.comm.crowd import batch_task
        assert batch_task(logging.getLogger("t"))
        seen = []
        t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
        t.start(); t.join()
        print(os.sched_getscheduler(0) == os.SCHED_BATCH, seen == [os.SCHED_BATCH])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.split() == ["True", "True"]  # the thread started later inherits it


FUTEX_PROGRAM = '''
import sys, time
from mpi4py import MPI
from pserver.comm.doorbell import Doorbells
world = MPI.COMM_WORLD
bells = Doorbells.create(world, True)
rank = world.Get_rank()
if rank == 0:
    seen = bells.seen()
    world.Barrier()  # rank 1 rings only after we read the counter
    bells.wait(seen, 60.0)
    print("rung", bells.seen() != seen, "covers", bells.covers(range(world.Get_size())))
else:
    world.Barrier()
    bells.ring(0)
world.Barrier()
bells.free()
'''


@pytest.mark.mpi
@pytest.mark.skipif(futex_call() is None, reason="no futex(2) here (not Linux on a known CPU)")
def test_a_ring_wakes_a_rank_sleeping_on_its_futex(tmp_path):
    """Two processes: rank 0 sleeps on its doorbell with a 60 s timeout; rank 1's ring ends it
    (the hard timeout of the job is shorter than the sleep)."""
    prog = tmp_path / "futex.py"
    prog.write_text(FUTEX_PROGRAM)
    res = run_program(2, prog, timeout=50.0)
    assert res.returncode == 0, res.output
    assert "rung True covers True" in res.stdout, res.output


@pytest.mark.mpi
def test_a_crowded_run_uses_doorbells_and_off_turns_them_off(tmp_path):
    from pserver.dump.check import check_dump
    from pserver.dump.reader import load_dump

    if (os.cpu_count() or 1) >= 7 and len(os.sched_getaffinity(0)) >= 7:
        pytest.skip("7 ranks are not a crowd on this machine's cores")
    for crowded in ("auto", "off"):
        out = tmp_path / crowded
        res = run_job(7, ["examples/quickstart.toml", f"run.out_dir={out}", "run.epochs=2",
                          "stats.progress=false", "run.log_level=debug", "protocol.name=async",
                          f"comm.crowded={crowded}"], timeout=120.0)  # fmt: skip
        assert res.returncode == 0, res.output
        used = "crowded node: doorbells for its 7 ranks" in res.stderr
        batch = "this learner is a SCHED_BATCH task" in res.stderr
        assert (used, batch) == ((True, True) if crowded == "auto" else (False, False))
        dump = load_dump(out / "stats.h5")
        assert check_dump(dump) == []
        assert dump.rows("updates") > 0
