"""The statistics server's live outputs: progress lines and TensorBoard scalars (issue 24).

Both are fed the rows the statistics server appends to the dump, in the same order, so every
figure can be recomputed from the dump: a line's or a point's training loss is the mean of the
``train`` rows since the previous one, ⟨σ⟩ that of every ``staleness`` row so far. The figures
and the ETA are :mod:`pserver.dump.progress`; the event file :mod:`pserver.dump.tensorboard`.

A TensorBoard point (every scalar but the tests') is written when rows came and
``stats.flush_interval`` seconds passed since the last one, before every test, and at the end,
each flushed at once. An event file that cannot be written (disk full) is given up with one
warning: the dump, not the scalars, is the record of the run. No MPI.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pserver.dump.progress import Cadence, RunShape, TrainWindow, epoch_line, interim_line
from pserver.dump.progress import sigma_text as sigma_line
from pserver.optim.rules import scheduled_lr
from pserver.plan.config import Config
from pserver.strategies import lookup

Sigma = tuple[float, int, int]  # Σσ, how many, max σ over the staleness rows so far


class Live:
    def __init__(
        self,
        cfg: Config,
        train_size: int,
        run_dir: Path,
        log: logging.Logger,
        rows: dict[str, int] | None = None,
        fresh: bool = True,
        t0: float | None = None,
    ) -> None:
        """``rows``: the dump's rows so far (a resumed run's steps go on from them); ``t0``:
        the wall time of the run's start (its clock: ``now`` arguments are seconds since)."""
        self.cfg, self.log = cfg, log
        self.shape = RunShape(cfg.run.epochs, train_size, cfg.data.batch_size)
        done = (rows or {}).get("train", 0)
        self.lines, self.points = TrainWindow(done, since=done), TrainWindow(done, since=done)
        self.line_due, self.point_due = Cadence(cfg.stats.progress_every), Cadence(
            cfg.stats.flush_interval)  # fmt: skip
        self.t0 = time.time() if t0 is None else t0
        self.lr: float | None = None
        self.last_tested = 0  # the last epoch tested
        self.own_lr = not lookup(cfg.protocol.name).ranks.servers  # no updates rows to read
        self.events: Any = None
        if cfg.stats.tensorboard:
            from pserver.dump.tensorboard import EventFile

            self.events = EventFile(run_dir, fresh)

    def rows(self, rows: dict[str, dict[str, Any]], now: float, sigma: Sigma) -> None:
        """A batch of rows as the dump got it."""
        losses = [float(x) for x in rows.get("train", {}).get("loss", ())]
        self.lines.add(losses)
        self.points.add(losses)
        lr = rows.get("updates", {}).get("lr")
        if lr is not None and len(lr):
            self.lr = float(lr[-1])
        running = self.last_tested < self.shape.epochs  # after the last test rows only drain
        if self.line_due.due(now) and self.lines.window_rows and running:
            self.line_due.reset(now)
            if self.cfg.stats.progress:
                self.log.info("%s", interim_line(self.shape, self.lines.rows, self.lines.take(),
                                                 sigma_line(*sigma), now, self.last_tested))
        if self.points.window_rows and self.point_due.due(now):
            self.point(now, sigma)

    def tested(
        self, epoch: int, loss: float, error: float, now: float, took: float, sigma: Sigma
    ) -> None:
        """A test's line and scalars (step: the epoch)."""
        self.last_tested = max(self.last_tested, epoch)
        if self.cfg.stats.progress:
            self.line_due.reset(now)
            self.lines.take()  # the next line's training loss starts after this test
            self.log.info("%s", epoch_line(self.shape, epoch, error, loss, sigma_line(*sigma),
                                           now, took))  # fmt: skip
        if self.events is not None:
            self.point(now, sigma)
            self.emit(epoch, {"test/error": error, "test/loss": loss}, now)

    def point(self, now: float, sigma: Sigma) -> None:
        """The training scalars at step = minibatches so far (module docstring)."""
        self.point_due.reset(now)
        if self.events is None or self.points.window_rows == 0:
            return
        step = self.points.rows
        values = {"train/loss": self.points.take()}
        total, n, largest = sigma
        if n:
            values.update({"staleness/mean": total / n, "staleness/max": largest})
        values["train/samples_per_s"] = step * self.shape.batch_size / max(now, 1e-9)
        lr = self.lr
        if self.own_lr:  # a learners-only run: the schedule at the epoch reached
            lr = scheduled_lr(self.cfg.optim, self.shape.epochs_done(step))
        if lr is not None:
            values["train/lr"] = lr
        self.emit(step, values, now)

    def emit(self, step: int, values: dict[str, Any], now: float) -> None:
        if self.events is None:  # given up after a failed write
            return
        try:
            self.events.write(step, values, self.t0 + now)
            self.events.flush()
        except OSError as e:
            self.log.warning("TensorBoard scalars stopped: cannot write the event file in %s "
                             "(%s); the dump goes on", self.cfg.run.out_dir, e)  # fmt: skip
            self.events = None

    def close(self, now: float, sigma: Sigma) -> None:
        """The last rows' point, and the event file closed."""
        if self.events is None:
            return
        self.point(now, sigma)
        if self.events is not None:
            try:
                self.events.close()
            except OSError as e:
                self.log.warning("TensorBoard scalars: closing the event file failed: %s", e)
            self.events = None
