"""Feature scaling (``data.scale``), computed from the training set only and applied to both sets.

Every scaling is ``x' = (x - offset) / scale`` with float64 constants, one pair for all
features (``per_feature = False``) or one per feature:

=========  ===========================================================================
none       offset 0, scale 1
minmax     per feature: (x - min) / (max - min), a constant feature left at x - min
standard   per feature: (x - mean) / std, a constant feature left at x - mean
auto       integer data (an HDF5 ``X`` of an integer dtype, e.g. uint8 images): the global
           min-max to [0, 1] (one pair: uint8 pixels 0..255 become x / 255); float data:
           none, with a warning when some |x| exceeds :data:`LARGE` (SGD at the usual
           learning rates diverges on such inputs)
=========  ===========================================================================

Unscaled uint8 images made SGD diverge without an error (docs/config.md, ``data.scale``);
the statistics server writes the scaling and its constants into the dump
(``data_scale`` attribute, ``model/input_offset`` and ``model/input_scale``, docs/stats.md).
Pure numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

MODES = ("auto", "none", "minmax", "standard")
LARGE = 100.0  # auto leaves float features alone, but warns when some |x| exceeds this
CHUNK = 4096  # rows per step of the statistics: float64 temporaries of CHUNK rows, not N


@dataclass(frozen=True)
class Scaling:
    requested: str  # data.scale
    applied: str  # none | minmax | standard
    per_feature: bool
    offset: np.ndarray = field(repr=False)  # float64, [1] or [F]
    scale: np.ndarray = field(repr=False)  # float64, [1] or [F], never 0
    reason: str = ""
    warning: str = ""

    def apply(self, X: np.ndarray) -> None:
        """Scale the float32 rows ``X`` in place (chunk by chunk: no full-size temporary)."""
        if self.applied == "none":
            return
        off, sc = self.offset.astype(X.dtype), self.scale.astype(X.dtype)
        for a in range(0, len(X), CHUNK):
            part = X[a : a + CHUNK]
            part -= off
            part /= sc

    def describe(self) -> str:
        """The ``data_scale`` attribute of the dump (JSON)."""
        return json.dumps({"requested": self.requested, "applied": self.applied,
                           "per_feature": self.per_feature, "reason": self.reason})


def choose(mode: str, X_train: np.ndarray, integer: bool) -> Scaling:
    """The scaling ``mode`` means for this training set; ``integer``: stored as integers."""
    if mode not in MODES:
        raise ValueError(f"data.scale = {mode!r}: expected one of {', '.join(MODES)}")
    one, zero = np.ones(1), np.zeros(1)
    if mode == "none":
        return Scaling(mode, "none", False, zero, one, "data.scale = none")
    if mode == "minmax":
        lo, hi = X_train.min(axis=0).astype(np.float64), X_train.max(axis=0).astype(np.float64)
        return Scaling(mode, "minmax", True, lo, nonzero(hi - lo), "data.scale = minmax")
    if mode == "standard":
        mean, std = moments(X_train)
        return Scaling(mode, "standard", True, mean, nonzero(std), "data.scale = standard")
    lo, hi = float(X_train.min()), float(X_train.max())
    if integer:
        return Scaling(mode, "minmax", False, np.array([lo]), nonzero(np.array([hi - lo])),
                       f"auto: integer features in [{lo:g}, {hi:g}] scaled to [0, 1]")
    warning = ""
    if max(abs(lo), abs(hi)) > LARGE:
        warning = (
            f"data.scale = auto left the float features as they are, but they span "
            f"[{lo:.4g}, {hi:.4g}]; SGD may diverge on inputs that large: set data.scale = "
            '"standard" or "minmax"'
        )
    return Scaling(mode, "none", False, zero, one, "auto: float features left as they are",
                   warning)


def nonzero(spread: np.ndarray) -> np.ndarray:
    """A constant feature (spread 0) keeps scale 1: it stays 0 after the offset."""
    return np.where(spread > 0, spread, 1.0)


def moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and (population) standard deviation, accumulated in float64 by chunks
    (two passes: the mean first, then the squared deviations, which does not cancel)."""
    n = len(X)
    total = np.zeros(X.shape[1])
    for a in range(0, n, CHUNK):
        total += X[a : a + CHUNK].sum(axis=0, dtype=np.float64)
    mean = total / n
    sq = np.zeros(X.shape[1])
    for a in range(0, n, CHUNK):
        d = X[a : a + CHUNK].astype(np.float64) - mean
        sq += np.einsum("ij,ij->j", d, d)
    return mean, np.sqrt(sq / n)
