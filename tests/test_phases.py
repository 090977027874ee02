"""A rank's phase timings (pserver.runtime.phases), the crowded node's back-off, and a rank's
own session (pserver.runtime.session)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pserver.comm.backoff import (
    BACKOFF,
    LONG_POLL,
    LONG_WAIT,
    MAX_CROWDED_POLL,
    MAX_LONG_POLL,
    SPIN_TESTS,
    Backoff,
    crowded_poll_max,
    crowded_spin,
    long_poll_max,
)
from pserver.comm.waiting import PeerLog, Waiter
from pserver.runtime.phases import PREFIX, Phases, process_start
from pserver.runtime.session import LAUNCHED, OPEN_MPI_DEFAULTS, alone, mpi_defaults

ROOT = Path(__file__).resolve().parents[1]


def test_process_start_is_before_now_and_after_a_plausible_start():
    started = process_start()
    assert started <= time.time()
    assert time.time() - started < 24 * 3600  # this test process, not boot time


def test_each_phase_counts_from_the_previous_one(caplog):
    phases = Phases(start=time.time())
    phases.mark("first")
    time.sleep(0.02)  # a phase of a known least length, not a wait for another thread
    phases.mark("second")
    assert [n for n, _, _ in phases.done] == ["first", "second"]
    assert phases.done[1][1] >= 0.02 > phases.done[0][1]
    log = logging.getLogger("test_phases")
    with caplog.at_level(logging.DEBUG, logger="test_phases"):
        phases.attach(log)  # the phases ended before the logger existed are logged now
        phases.mark("third")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    pattern = re.compile(re.escape(PREFIX) + r"[a-z]+: [0-9.]+ s wall, [0-9.]+ s CPU")
    assert all(pattern.fullmatch(x) for x in lines)  # what scripts/bench_startup.py parses


def test_crowded_poll_max_scales_with_ranks_per_core():
    assert crowded_poll_max(1e-3, 2, cores=2) == 1e-3  # a rank per core: unchanged
    assert crowded_poll_max(1e-3, 1, cores=16) == 1e-3
    assert crowded_poll_max(1e-3, 7, cores=2) == 3.5e-3
    assert crowded_poll_max(1e-3, 131, cores=2) == MAX_CROWDED_POLL  # capped
    assert crowded_poll_max(0.5, 131, cores=2) == 0.5  # a user's longer poll_max stays


def test_crowded_spin_divides_the_spinning_tests_by_ranks_per_core():
    assert crowded_spin(2, cores=2) == SPIN_TESTS
    assert crowded_spin(8, cores=2) == SPIN_TESTS // 4
    assert crowded_spin(1000, cores=2) == 1  # at least one test before a sleep
    backoff = Backoff(1e-5, 1e-3, spin=3)
    assert [backoff.next_sleep() > 0 for _ in range(4)] == [False, False, True, True]


def test_a_long_wait_sleeps_longer_and_a_short_one_as_before():
    """Sleeps pass poll_max only once the wait has lasted LONG_WAIT (1/8 of the time waited
    each), up to the long ceiling: an idle rank wakes ~50 times a second, a busy wait sleeps
    exactly as without the long ceiling."""
    for long in (None, LONG_POLL):
        b = Backoff(1e-5, 1e-3, spin=1, long=long)
        b.since -= 0.004  # 4 ms waited: 0.5 ms, below poll_max either way
        assert b.next_sleep() == pytest.approx(BACKOFF * 0.004, rel=0.05)
        b.since -= 0.004  # 8 ms: poll_max either way
        assert b.next_sleep() == pytest.approx(1e-3, rel=0.05)
        b.since -= LONG_WAIT * 0.8  # still short of LONG_WAIT: poll_max either way
        assert b.next_sleep() == 1e-3
        b.since -= 1.0  # a second: the long ceiling, or poll_max without one
        assert b.next_sleep() == (1e-3 if long is None else LONG_POLL)
    b = Backoff(1e-5, 1e-3, spin=1, long=1.0)
    b.since -= 2 * LONG_WAIT  # past LONG_WAIT: 1/8 of the time waited, below the long ceiling
    assert b.next_sleep() == pytest.approx(BACKOFF * 2 * LONG_WAIT, rel=0.05)


def test_long_poll_max_scales_with_ranks_per_core_and_is_the_waiters_default():
    assert long_poll_max(1e-3, 2, cores=2) == LONG_POLL
    assert long_poll_max(1e-3, 4, cores=2) == 2 * LONG_POLL
    assert long_poll_max(1e-3, 131, cores=2) == MAX_LONG_POLL
    assert long_poll_max(0.5, 131, cores=2) == 0.5  # a user's longer poll_max stays
    log = logging.getLogger("test")
    assert Waiter(log, PeerLog()).long_max == LONG_POLL
    assert Waiter(log, PeerLog(), poll_max=0.5).long_max == 0.5
    assert Waiter(log, PeerLog(), long_max=0.05).long_max == 0.05


def run_child(env: dict[str, str]) -> list[str]:
    """A child process that leads its own process group (as Open MPI starts a rank) calls
    own_session; what it then is."""
    code = (
        "import os; os.setpgid(0, 0); from pserver.runtime.session import own_session; "
        "s = own_session(); print(s, os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=60, check=True, stdin=subprocess.DEVNULL,  # as a launcher starts a rank
    )  # fmt: skip
    return out.stdout.split()


def test_a_launched_rank_gets_a_session_and_keeps_its_process_group():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHED}
    assert run_child({**env, "PMIX_RANK": "0"}) == ["True", "True", "True"]


def test_a_process_not_launched_by_mpi_stays_in_its_session():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHED}
    assert run_child(env) == ["False", "False", "True"]


def test_open_mpi_defaults_only_where_the_user_left_them_unset():
    launched = {"PMIX_RANK": "0"}
    env = dict(launched)
    assert mpi_defaults(env) == OPEN_MPI_DEFAULTS
    assert env == {**launched, **OPEN_MPI_DEFAULTS}
    mine = {**launched, "OMPI_MCA_btl": "self,tcp"}
    assert mpi_defaults(mine) == {} and mine["OMPI_MCA_btl"] == "self,tcp"
    assert mpi_defaults({}) == {}  # not under a launcher: nothing set
    assert mpi_defaults({"PMI_RANK": "0"}) == {}  # MPICH's Hydra: not Open MPI's business


def test_h5py_imports_without_forking_uname_and_uname_reads_the_same():
    """uname_without_fork: the five uname(2) fields read as before, no child process for them
    (h5py's import reads the machine), and the processor field still Python's own."""
    code = (
        "import platform, sys\n"
        "before = tuple(platform.uname()[i] for i in range(5)), platform.processor()\n"
        "platform._uname_cache = None\n"
        "from pserver.runtime.session import uname_without_fork\n"
        "uname_without_fork(); uname_without_fork()\n"
        "forks = []\n"
        "sys.addaudithook(lambda ev, args: forks.append(args) if ev == 'subprocess.Popen' else 0)\n"
        "import h5py\n"
        "u = platform.uname()\n"
        "after = tuple(u[i] for i in range(5)), None\n"
        "quiet = list(forks)\n"
        "after = after[0], u[5]\n"
        "print(before == after, quiet == [], u[-1] == u.processor, u[:5] == before[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["True", "True", "True", "True"]


def test_a_rank_is_alone_when_launched_and_its_main_thread_is_its_only_one():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHED}
    assert not alone(env)  # not launched: main() called in a test or a notebook
    assert alone({**env, "PMI_RANK": "0"}) == (threading.active_count() == 1)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert not alone({**env, "PMI_RANK": "0"})  # a thread that could still call MPI
    finally:
        stop.set()
        other.join()
