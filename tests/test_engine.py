"""The communication engine (pserver.comm.engine) and the one back-off, in one process, no MPI."""

from __future__ import annotations

import logging
import threading

import pytest

from pserver.comm import backoff
from pserver.comm.backoff import Backoff
from pserver.comm.engine import CommEngine
from pserver.comm.waiting import PeerLog, Waiter


def make_waiter() -> Waiter:
    return Waiter(logging.getLogger("test_engine"), PeerLog(), 1e-5, 1e-4, stall_timeout=60.0)


class Counter:
    """A progress callable: completes one 'request' per call until ``total`` are done."""

    def __init__(self, total: int, fail_at: int = -1) -> None:
        self.total, self.fail_at, self.done, self.calls = total, fail_at, 0, 0
        self.threads: set[str] = set()

    def __call__(self) -> bool:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.done == self.fail_at:
            raise ValueError("progress failed")
        if self.done < self.total:
            self.done += 1
            return True
        return False


@pytest.mark.parametrize("threaded", [True, False])
def test_wait_returns_once_progress_makes_ready_true(threaded: bool) -> None:
    counter = Counter(50)
    engine = CommEngine(counter, make_waiter(), threaded)
    engine.start()
    try:
        blocked = engine.wait(lambda: counter.done == 50, "50 completions")
    finally:
        engine.close()
    assert counter.done == 50 and blocked >= 0.0
    # thread mode: progress runs on the comm thread only; nonblocking: on the waiting thread
    assert counter.threads == ({"comm"} if threaded else {threading.current_thread().name})


def test_stop_event_ends_the_thread() -> None:
    counter = Counter(5)  # then nothing more completes: the thread backs off until stopped
    engine = CommEngine(counter, make_waiter(), threaded=True)
    engine.start()
    engine.wait(lambda: counter.done == 5, "five completions")
    engine.close()
    assert not engine.thread.is_alive() and engine.stop.is_set()
    calls = counter.calls
    assert counter.calls == calls  # nothing drives progress any more


def test_progress_error_propagates_to_the_waiting_thread() -> None:
    engine = CommEngine(Counter(10, fail_at=3), make_waiter(), threaded=True)
    engine.start()
    with pytest.raises(RuntimeError, match="communication thread failed") as info:
        engine.wait(lambda: False, "something that never happens")
    engine.close()
    assert isinstance(info.value.__cause__, ValueError)


def test_progress_error_propagates_in_nonblocking_mode() -> None:
    engine = CommEngine(Counter(10, fail_at=2), make_waiter(), threaded=False)
    with pytest.raises(ValueError, match="progress failed"):
        engine.wait(lambda: False, "something that never happens")


def test_backoff_spins_then_grows_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(backoff.time, "monotonic", lambda: clock[0])
    b = Backoff(1e-5, 1e-3)
    assert [b.next_sleep() for _ in range(backoff.SPIN_TESTS - 1)] == [0.0] * (
        backoff.SPIN_TESTS - 1
    )
    assert b.next_sleep() == 1e-5  # no time idle yet: the floor
    clock[0] += 0.004
    assert b.next_sleep() == pytest.approx(backoff.BACKOFF * 0.004)
    clock[0] += 10.0
    assert b.next_sleep() == 1e-3  # the ceiling
    b.restart()
    assert b.next_sleep() == 0.0  # spinning again after a completion


def test_one_backoff_in_the_code_base() -> None:
    """The back-off constants are read by pserver/comm/backoff.py alone (its ``Backoff``):
    no other module re-implements the back-off (the simulator drives that very class)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    users = set()
    for path in [*root.glob("pserver/**/*.py"), *root.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
            if isinstance(node, ast.alias):
                name = node.name
            if name in ("BACKOFF", "SPIN_TESTS"):
                users.add(path.relative_to(root).as_posix())
    assert users == {"pserver/comm/backoff.py"}
