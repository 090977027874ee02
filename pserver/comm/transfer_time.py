"""How long a transfer should take, learned from the last ones of the same kind.

A rank waiting for a non-blocking collective moves it on only while it tests it (MPICH), so the
back-off's sleeps cost bandwidth; a blocking call would burn a core for as long as a late peer
keeps it waiting. :class:`TransferClock` gives the window between the two: the transfer's
expected duration, ``factor × bytes / bandwidth``, during which the wait polls at its shortest
sleep (:class:`pserver.comm.backoff.Backoff`'s ``tight``) before it backs off.

The bandwidth is the best of the last ``history`` transfers (bytes / seconds from start to
completion). A transfer slowed by a late peer thus never lengthens the window (it only lowers
one sample, and the best is kept); a machine that became slower shortens it for at most
``history`` transfers. So the time spent polling tightly is at most ``factor`` times what the
transfer takes when every rank is on time, whatever the peers do; before any sample the
bandwidth is ``initial``.
"""

from __future__ import annotations

from collections import deque

INITIAL_BYTES_PER_S = 1e9  # before the first sample: shared memory moves a few GB/s
HISTORY = 8
TIGHT_FACTOR = 2.0  # poll tightly for twice the expected time: jitter, the first buckets' start


class TransferClock:
    def __init__(
        self,
        factor: float = TIGHT_FACTOR,
        initial: float = INITIAL_BYTES_PER_S,
        history: int = HISTORY,
    ) -> None:
        if factor < 0 or initial <= 0 or history < 1:
            raise ValueError(
                f"need factor >= 0, initial > 0 and history >= 1, not {factor}, {initial}, "
                f"{history}"
            )
        self.factor, self.initial = factor, initial
        self.samples: deque[float] = deque(maxlen=history)

    def observe(self, nbytes: int, seconds: float) -> None:
        """A transfer of ``nbytes`` completed ``seconds`` after it started."""
        if nbytes > 0 and seconds > 0:
            self.samples.append(nbytes / seconds)

    @property
    def bandwidth(self) -> float:
        """Bytes per second of the best recent transfer (``initial`` before any)."""
        return max(self.samples, default=self.initial)

    def window(self, nbytes: int) -> float:
        """Seconds to poll tightly for a transfer of ``nbytes`` (0 with ``factor = 0``)."""
        return self.factor * max(nbytes, 0) / self.bandwidth
