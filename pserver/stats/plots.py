"""The figures of ``pserver-stats plot``: staleness distribution, test error, training loss.

Figures are built with :class:`matplotlib.figure.Figure` and saved through its Agg canvas, so
plotting never selects a global backend or opens a window (it runs on headless cluster nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pserver.dump.reader import Dump, applied_staleness

MAX_LEGEND_ENTRIES = 12  # beyond this a legend hides the plot (Rudra ran 30-54 learners)
TIME_LABEL = "wall time (s)"
EPOCH_LABEL = "epoch (passes over the training set)"
ERROR_LABEL = "test error (%)"
LOSS_LABEL = "training loss (minibatch mean)"


def _empty(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this dump", ha="center", va="center", transform=ax.transAxes)


def _legend(ax: Axes, n_series: int) -> None:
    if 0 < n_series <= MAX_LEGEND_ENTRIES:
        ax.legend(fontsize="small")


def _run_label(dump: Dump) -> str:
    protocol = dump.attrs.get("protocol", "?")
    learners = dump.attrs.get("n_learners", "?")
    return f"{protocol}, λ={learners}"


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (the first ``window - 1`` points average what exists so far)."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or values.size == 0:
        return values
    csum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


SIGMA_LABEL = "staleness σ (weight updates)"
PROB_LABEL = "probability (share of applied contributions)"


def staleness_axes(ax: Axes, max_sigma: int, probabilities: Sequence[float]) -> None:
    """Axes a reader can trust: σ on integer ticks with a half-step margin (σ = 0 alone is not
    one dot between fractional ticks), probabilities never above 1; log scale only when
    there is a tail to show (Rudra Fig. 3: σ > 2n at probabilities below 1e-4)."""
    ax.set_xlim(-0.5, max(max_sigma, 1) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(SIGMA_LABEL)
    ax.set_ylabel(PROB_LABEL)
    positive = [p for p in probabilities if p > 0]
    if positive and min(positive) < 1.0:
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 2, 1.0)
    else:
        ax.set_ylim(0.0, 1.0)


def all_fresh_note(ax: Axes, count: int) -> None:
    """The display of σ = 0 everywhere (hardsync): say it in words on the plot."""
    ax.text(
        0.5, 0.5, f"σ = 0 for all {count} applied gradients\n(every gradient computed on the "
        "current weights)", ha="center", va="center", transform=ax.transAxes,
    )  # fmt: skip


def plot_staleness(dump: Dump, path: Path) -> Path:
    """Write :func:`staleness_figure` to ``path``."""
    staleness_figure(dump).savefig(path, dpi=120, bbox_inches="tight")
    return path


def staleness_figure(dump: Dump) -> Figure:
    """Probability of each staleness value σ per learner, as in Rudra Fig. 3 (inset)."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    # every strategy's σ from one record (docs/stats.md, *Staleness σ*)
    stale, learner = applied_staleness(dump)
    probs: list[float] = []
    if stale.size == 0:
        _empty(ax, "gradients")
        mean_text = "n/a"
    elif not stale.any():
        ax.bar([0], [1.0], width=0.6, label="all learners")
        all_fresh_note(ax, int(stale.size))
        probs, mean_text = [1.0], "0"
    else:
        lids = np.unique(learner)
        for lid in lids:
            values, counts = np.unique(stale[learner == lid], return_counts=True)
            p = counts / counts.sum()
            ax.plot(values, p, marker="o", ms=3, lw=1, label=f"learner {lid}", clip_on=False)
            probs.extend(p.tolist())
        _legend(ax, len(lids))
        mean_text = f"{stale.mean():.3f}"
    staleness_axes(ax, int(stale.max()) if stale.size else 0, probs)
    ax.set_title(f"gradient staleness ({_run_label(dump)}): ⟨σ⟩ = {mean_text}")
    return fig


def plot_test_error(dump: Dump, path: Path) -> Path:
    """Test error against wall time (left) and against epochs (right)."""
    fig = Figure(figsize=(10, 4))
    ax_time, ax_epoch = fig.subplots(1, 2, sharey=True)
    test = dump.group("test")
    for ax, key, label in ((ax_time, "time", TIME_LABEL), (ax_epoch, "epoch", EPOCH_LABEL)):
        if dump.rows("test") and key in test and "error" in test:
            ax.plot(test[key], 100 * test["error"], marker="o", ms=3)
        else:
            _empty(ax, "test rows")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    ax_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_time.set_ylabel(ERROR_LABEL)
    fig.suptitle(f"test error ({_run_label(dump)})")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_train_loss(dump: Dump, path: Path) -> Path:
    """Training loss against wall time per learner: raw points faint, moving average bold."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    train = dump.group("train")
    if not dump.rows("train") or not {"time", "loss"} <= train.keys():
        _empty(ax, "training rows")
        lids = np.zeros(0)
    else:
        learner = train.get("learner", np.zeros(dump.rows("train"), np.int64))
        lids = np.unique(learner)
        for lid in lids:
            mine = learner == lid
            t, loss = train["time"][mine], train["loss"][mine]
            window = max(1, loss.size // 50)  # about 50 independent points per curve
            (line,) = ax.plot(t, smooth(loss, window), lw=1.2, label=f"learner {lid}")
            ax.plot(t, loss, lw=0.5, alpha=0.15, color=line.get_color())
    _legend(ax, len(lids))
    ax.set_xlabel(TIME_LABEL)
    ax.set_ylabel(LOSS_LABEL)
    ax.set_title(f"training loss ({_run_label(dump)})")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_all(dump: Dump, outdir: Path) -> list[Path]:
    """Write ``staleness.png``, ``test_error.png`` and ``train_loss.png`` into ``outdir``."""
    outdir.mkdir(parents=True, exist_ok=True)
    return [
        plot_staleness(dump, outdir / "staleness.png"),
        plot_test_error(dump, outdir / "test_error.png"),
        plot_train_loss(dump, outdir / "train_loss.png"),
    ]
