"""The curves of an experiment of several seeds, for the figure of ``pserver-stats compare``:
the mean over the seeds and its band (± one sample standard deviation), and colours that no
two experiments share.

Numbers only (numpy arrays in and out); :mod:`pserver.stats.compare_plots` draws them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pserver.dump.reader import Dump
from pserver.stats.plots import smooth
from pserver.stats.tables import applied_staleness

LOSS_POINTS = 50  # the moving average spans about 1/50 of a run's minibatches
GRID = 200  # points of the common time axis the seeds' loss curves are read on


@dataclass(frozen=True)
class Band:
    """x, the mean over the seeds, and their sample standard deviation (0 for one seed)."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray


def spread(ys: np.ndarray) -> np.ndarray:
    """Sample standard deviation over the first axis (ddof 1); zeros for a single row."""
    return ys.std(axis=0, ddof=1) if ys.shape[0] > 1 else np.zeros(ys.shape[1])


def error_band(dumps: Sequence[Dump], key: str) -> Band | None:
    """Test error (%) against ``key`` (``time`` or ``epoch``): the k-th tests of the seeds go
    together (the same epoch), up to the fewest any seed has; x is their mean ``key``."""
    rows = [d.group("test") for d in dumps if d.rows("test")]
    rows = [t for t in rows if key in t and "error" in t]
    if not rows:
        return None
    n = min(len(t["error"]) for t in rows)
    xs = np.array([np.asarray(t[key][:n], np.float64) for t in rows])
    ys = 100 * np.array([np.asarray(t["error"][:n], np.float64) for t in rows])
    return Band(xs.mean(axis=0), ys.mean(axis=0), spread(ys))


def loss_curve(dump: Dump) -> tuple[np.ndarray, np.ndarray] | None:
    """(time, training loss) of one run, all learners' minibatches in time order, as a moving
    average over about 1/:data:`LOSS_POINTS` of them."""
    train = dump.group("train")
    if not dump.rows("train") or not {"time", "loss"} <= train.keys():
        return None
    order = np.argsort(train["time"], kind="stable")
    t, loss = train["time"][order], train["loss"][order]
    return t, smooth(loss, max(1, loss.size // LOSS_POINTS))


def loss_band(dumps: Sequence[Dump]) -> Band | None:
    """The seeds' smoothed training loss: one run as it is; several read on a common time
    grid over the span they all cover (else over the shortest run)."""
    curves = [c for c in map(loss_curve, dumps) if c is not None]
    if not curves:
        return None
    if len(curves) == 1:
        t, y = curves[0]
        return Band(t, y, np.zeros_like(y))
    lo = max(float(t[0]) for t, _ in curves)
    hi = min(float(t[-1]) for t, _ in curves)
    grid = np.linspace(lo, hi, GRID) if hi > lo else np.array([lo])
    ys = np.array([np.interp(grid, t, y) for t, y in curves])
    return Band(grid, ys.mean(axis=0), spread(ys))


def staleness_mix(dumps: Sequence[Dump]) -> tuple[np.ndarray, np.ndarray, float, float | None]:
    """σ values, their probability over every seed's applied contributions together, and ⟨σ⟩
    as the compare table has it: the mean of the runs' ⟨σ⟩ and its std (None for one run)."""
    per_run = [applied_staleness(d) for d in dumps]
    per_run = [s for s in per_run if s.size]
    if not per_run:
        return np.zeros(0, np.int64), np.zeros(0), float("nan"), None
    values, counts = np.unique(np.concatenate(per_run), return_counts=True)
    means = np.array([s.mean() for s in per_run])
    std = float(means.std(ddof=1)) if means.size > 1 else None
    return values, counts / counts.sum(), float(means.mean()), std


def distinct_colors(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` colours, none repeated: tab10 up to 10, tab20 up to 20, else ``n`` evenly spaced
    samples of the turbo colour map."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["turbo"](x) for x in np.linspace(0.03, 0.97, n)]
