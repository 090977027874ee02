"""What the statistics server says while the run goes: progress lines, their ETA, and the
windows of ``train`` rows that the lines and the TensorBoard scalars summarize.

Pure: no MPI, no I/O; the clock is passed in (``now``: seconds since the run's start), so the
lines and their timing are tested in one process (``tests/test_progress.py``).

**ETA.** The time still to run at the rate so far, ``t · (E − e) / e`` for ``e`` epochs done of
``E`` at ``t`` seconds since the start: a run that slows down (a straggler, a busier machine)
shows it in the next line. At a test ``e`` is the epoch tested; between tests it is estimated
from the minibatches computed (``train`` rows × ``data.batch_size`` ÷ the training set), which
counts the gradients a protocol drops as well, so between tests it runs a little ahead under
softsync and PSP.

**Lines between tests** (``stats.progress_every`` seconds, :class:`Cadence`): at most one per
interval, each when rows arrive; a test's line starts the interval again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def eta(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left at the rate so far (module docstring); None before any progress."""
    if done <= 0 or elapsed <= 0:
        return None
    return max(0.0, elapsed * (total - done) / done)


def duration(seconds: float | None) -> str:
    """``45s``, ``3m07s``, ``2h05m``; ``-`` for an unknown time."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def sigma_text(total: float, n: int, largest: int) -> str:
    """⟨σ⟩ and max σ over the ``staleness`` rows received so far (none yet: no figure)."""
    if not n:
        return "<sigma> -  max sigma -"
    return f"<sigma> {total / n:.2f}  max sigma {largest}"


@dataclass
class Cadence:
    """A line at most every ``every`` seconds (0: never); ``reset`` when any line is printed."""

    every: float
    last: float = 0.0

    def due(self, now: float) -> bool:
        return self.every > 0 and now - self.last >= self.every

    def reset(self, now: float) -> None:
        self.last = now


@dataclass
class TrainWindow:
    """``train`` rows: all of them counted, their losses summed since the last :meth:`take`."""

    rows: int = 0  # since the start of the run (a resumed run: since the first part's start)
    window_rows: int = 0
    window_loss: float = 0.0
    since: int = field(default=0)  # ``rows`` at the last take: a point covers rows since..rows

    def add(self, losses: list[float]) -> None:
        self.rows += len(losses)
        self.window_rows += len(losses)
        self.window_loss += math.fsum(losses)

    def take(self) -> float | None:
        """The mean loss of the rows since the last take (None: none came), and start anew."""
        mean = self.window_loss / self.window_rows if self.window_rows else None
        self.window_rows, self.window_loss, self.since = 0, 0.0, self.rows
        return mean


@dataclass(frozen=True)
class RunShape:
    """What turns rows into epochs: the run's length, the training set, the minibatch."""

    epochs: int
    train_size: int
    batch_size: int

    def epochs_done(self, minibatches: int) -> float:
        """Epochs computed so far, estimated from the minibatches (module docstring)."""
        return minibatches * self.batch_size / self.train_size


def epoch_line(
    shape: RunShape, epoch: int, error: float, loss: float, sigma: str, now: float, took: float
) -> str:
    """The line of a test: its figures, samples/s over the whole run so far, and the ETA."""
    samples = epoch * shape.train_size
    return (
        f"epoch {epoch}/{shape.epochs}  test error {100 * error:.2f}%  loss {loss:.4f}  {sigma}  "
        f"{samples / max(now, 1e-9):.0f} samples/s  t={now:.1f}s  "
        f"ETA {duration(eta(now, epoch, shape.epochs))}  (test took {took:.2f}s)"
    )


def interim_line(
    shape: RunShape, minibatches: int, train_loss: float | None, sigma: str, now: float,
    tested: int = 0,
) -> str:
    """A line between tests (``stats.progress_every``): where the run is, estimated from the
    minibatches computed (never behind ``tested``, the last epoch tested: a learner's rows
    reach the statistics server after the model it computed on), and the mean training loss
    since the last line."""
    done = max(shape.epochs_done(minibatches), tested)
    loss = "-" if train_loss is None else f"{train_loss:.4f}"
    return (
        f"epoch ~{done:.2f}/{shape.epochs}  train loss {loss}  {sigma}  "
        f"{done * shape.train_size / max(now, 1e-9):.0f} samples/s  t={now:.1f}s  "
        f"ETA {duration(eta(now, done, shape.epochs))}"
    )
