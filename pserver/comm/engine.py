"""One owner of MPI progress per rank: the communication engine of the overlapped exchanges.

A ``progress()`` callable tests a rank's outstanding requests once and says whether something
completed. The engine drives it in one of two ways (``comm.mode``):

``thread``: a communication thread calls ``progress()`` under the engine's lock, wakes the
waiting threads through the condition variable whenever something completed, and sleeps with
the Waiter's back-off (:class:`pserver.comm.backoff.Backoff`) when nothing did, so it burns no
core; progress continues while the compute thread runs numpy/CuPy kernels (which release the
GIL). A ``progress()`` that raises ends the thread, and the error is raised again on the thread
that waits (:meth:`CommEngine.wait`).

``nonblocking``: no thread; ``progress()`` runs inside :meth:`CommEngine.wait`, in the
:class:`~pserver.comm.waiting.Waiter`'s back-off loop (whose liveness checks and stall reports
apply).

Liveness: a wait ends once ``ready()`` holds; ``ready()`` is evaluated after every
``progress()`` that completed something (thread: under the lock, on notification; nonblocking:
after each test), so a wait whose condition is made true by a completed request cannot miss it.
The thread stops when :attr:`CommEngine.stop` is set (:meth:`close`), at the latest one
``poll_max`` after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pserver.comm.backoff import Backoff
from pserver.comm.waiting import StallClock, Waiter, tighten_timer_slack

STALL_PACE = 0.5  # a thread-mode wait wakes this often for its stall clock and liveness check

Progress = Callable[[], bool]


class CommEngine:
    """Drives ``progress`` in a thread (``threaded``) or inside waits; see the module."""

    def __init__(self, progress: Progress, waiter: Waiter, threaded: bool) -> None:
        self.progress, self.waiter, self.threaded = progress, waiter, threaded
        self.lock = threading.Condition()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.loop, name="comm", daemon=True)

    def start(self) -> None:
        if self.threaded:
            self.thread.start()

    def close(self) -> None:
        """Stop the thread (if any) and wait for it to end."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def loop(self) -> None:
        """The communication thread: test, notify on change, back off when idle."""
        tighten_timer_slack()
        w = self.waiter
        backoff = Backoff(w.poll_min, w.poll_max, spin=w.spin, long=w.long_max)
        try:
            while not self.stop.is_set():
                if self.step():
                    backoff.restart()
                    continue
                pause = backoff.next_sleep()
                if pause:
                    self.stop.wait(pause)
        except BaseException as e:  # raised again on the waiting thread
            with self.lock:
                self.error = e
                self.lock.notify_all()

    def step(self) -> bool:
        """One ``progress()`` under the lock; wakes the waiters when something completed."""
        with self.lock:
            changed = self.progress()
            if changed:
                self.lock.notify_all()
        return changed

    def wait(self, ready: Callable[[], bool], what: str) -> float:
        """Block until ``ready()``; returns the seconds blocked. ``ready`` runs under the lock
        (thread mode) or between progress tests (nonblocking)."""
        start = time.perf_counter()
        if self.threaded:
            self._wait_thread(ready, what)
        else:
            self.waiter.until(lambda: (self.progress() and False) or ready(), what)
        return time.perf_counter() - start

    def _wait_thread(self, ready: Callable[[], bool], what: str) -> None:
        w = self.waiter
        # woken by the comm thread's notify; the timeout only paces the stall clock, which
        # must see a SIGSTOP of this rank as a gap, so it is short
        stall = StallClock(w.stall_timeout, w.log, sleep=lambda s: self.lock.wait(timeout=s))
        with self.lock:
            while not ready():
                if self.error is not None:
                    raise RuntimeError("the communication thread failed") from self.error
                stall.sleep(min(STALL_PACE, w.stall_timeout), what)
                w.check_peers(what, time.monotonic())
                if stall.due():
                    w.report_stall(stall.stalled(), what)
