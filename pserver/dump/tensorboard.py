"""TensorBoard scalars of a run, written while it goes (``stats.tensorboard = true``).

The statistics server (:mod:`pserver.roles.live`) writes event files
``events.out.tfevents.<time>.<host>`` into the run directory, beside ``stats.h5``, so
``tensorboard --logdir runs/quickstart`` shows each run of that name under its id. The records
are written synchronously with tensorboardX's record writer (no writer thread on the
statistics rank) and flushed at every point, which comes at most every
``stats.flush_interval`` seconds and at every test: the file is as fresh as the dump.

tensorboardX is an optional dependency (the ``tensorboard`` extra; it needs neither TensorFlow
nor PyTorch): :func:`require` turns its absence into bad input before training.

No MPI. ``docs/stats.md`` (*TensorBoard*) lists :data:`TAGS`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pserver.errors import ConfigError

PREFIX = "events"  # tensorboardX's file names: events.out.tfevents.<time>.<host>
PATTERN = f"{PREFIX}.out.tfevents.*"

#: tag -> what it is; the step of the ``test/`` tags is the epoch, of the others the number of
#: minibatches computed so far (the dump's ``train`` rows, every learner's together)
TAGS = {
    "test/error": "test error (share of the test set misclassified), dump test/error",
    "test/loss": "test loss, dump test/loss",
    "train/loss": "mean training loss of the minibatches since the previous point "
    "(dump train/loss rows between the two steps)",
    "staleness/mean": "<sigma>: mean σ over the staleness rows so far (the progress line's)",
    "staleness/max": "max σ over the staleness rows so far",
    "train/samples_per_s": "minibatches so far × data.batch_size ÷ seconds since the start",
    "train/lr": "learning rate of the last update (dump updates/lr); a learners-only strategy "
    "(no updates rows): the schedule's base rate at that epoch",
}


def require() -> None:
    """Bad input unless tensorboardX can be imported (asked by the statistics rank in
    :func:`pserver.runtime.context.prepare`)."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"stats.tensorboard = true needs the package tensorboardX, which cannot be imported "
            f"here ({e}): pip install tensorboardX (or pip install -e .[tensorboard]), or set "
            "stats.tensorboard = false"
        ) from None


class EventFile:
    """One event file in ``folder``; a fresh run first removes the event files of an earlier
    run written there (``run.overwrite``), a resumed one adds a file beside them."""

    def __init__(self, folder: Path, fresh: bool) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        if fresh:
            for old in folder.glob(PATTERN):
                old.unlink()
        self.Event, self.Summary = Event, Summary
        # tensorboardX names a file by the second it was opened: the nanoseconds keep apart
        # (and in order) the files of periodic-checkpoint parts opened in the same second
        self.writer: Any = EventsWriter(str(folder / PREFIX), f".{time.time_ns()}")

    def write(self, step: int, values: dict[str, float], walltime: float) -> None:
        """One event holding every value of this step."""
        summary = self.Summary(
            value=[self.Summary.Value(tag=t, simple_value=float(v)) for t, v in values.items()]
        )
        self.writer.write_event(self.Event(wall_time=walltime, step=step, summary=summary))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
