"""The figure of ``pserver-stats compare``: several runs overlaid, one colour per run.

Four panels, as a paper would put them side by side (Rudra Figs. 3-8): test error against
wall time and against epochs, the training loss against wall time (a moving average over all
learners' minibatches), and the staleness distributions. Built on
:class:`matplotlib.figure.Figure` (no global backend, headless), like :mod:`pserver.stats.plots`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pserver.dump.reader import Dump
from pserver.stats.plots import (
    EPOCH_LABEL,
    ERROR_LABEL,
    LOSS_LABEL,
    MAX_LEGEND_ENTRIES,
    TIME_LABEL,
    all_fresh_note,
    smooth,
    staleness_axes,
)
from pserver.stats.tables import applied_staleness, staleness_distribution

LOSS_POINTS = 50  # the moving average spans about 1/50 of a run's minibatches


def _test_curve(ax: Axes, dump: Dump, key: str, label: str, color: str) -> None:
    test = dump.group("test")
    if dump.rows("test") and key in test and "error" in test:
        ax.plot(test[key], 100 * test["error"], marker="o", ms=3, label=label, color=color)


def _loss_curve(ax: Axes, dump: Dump, label: str, color: str) -> None:
    train = dump.group("train")
    if not dump.rows("train") or not {"time", "loss"} <= train.keys():
        return
    order = np.argsort(train["time"], kind="stable")
    t, loss = train["time"][order], train["loss"][order]
    ax.plot(t, smooth(loss, max(1, loss.size // LOSS_POINTS)), lw=1.2, label=label, color=color)


def _staleness(ax: Axes, dumps: Sequence[Dump], names: Sequence[str], colors: list[str]) -> None:
    """σ of every run on one integer axis; a run with σ = 0 throughout is one bar at 0."""
    probs: list[float] = []
    top = 0
    fresh = []
    for dump, name, color in zip(dumps, names, colors, strict=True):
        dist = staleness_distribution(dump)
        if not dist["count"].size:
            continue
        top = max(top, int(dist["staleness"][-1]))
        seen = dist["count"] > 0
        x, p = dist["staleness"][seen], dist["probability"][seen]
        probs.extend(p.tolist())
        if x.size == 1 and x[0] == 0:
            fresh.append(int(dist["count"][0]))
            ax.plot([0], [1.0], marker="s", ms=7, ls="none", color=color, clip_on=False,
                    label=f"{name} (σ = 0 always)")  # fmt: skip
        else:
            ax.plot(x, p, marker="o", ms=3, lw=1, color=color, clip_on=False,
                    label=f"{name}: ⟨σ⟩ = {applied_staleness(dump).mean():.2f}")  # fmt: skip
    if not probs:
        ax.text(0.5, 0.5, "no applied gradients", ha="center", va="center", transform=ax.transAxes)
    elif len(fresh) == len(dumps):
        all_fresh_note(ax, sum(fresh))
    staleness_axes(ax, top, probs)


def compare_figure(dumps: Sequence[Dump], names: Sequence[str]) -> Figure:
    """The four panels of the module docstring for ``dumps``, labelled by ``names``."""
    fig = Figure(figsize=(12, 8.5), layout="constrained")
    (ax_time, ax_epoch), (ax_loss, ax_sigma) = fig.subplots(2, 2)
    colors = [f"C{i % 10}" for i in range(len(dumps))]
    for dump, name, color in zip(dumps, names, colors, strict=True):
        _test_curve(ax_time, dump, "time", name, color)
        _test_curve(ax_epoch, dump, "epoch", name, color)
        _loss_curve(ax_loss, dump, name, color)
    _staleness(ax_sigma, dumps, names, colors)
    for ax, xlabel, ylabel, title in (
        (ax_time, TIME_LABEL, ERROR_LABEL, "test error against time"),
        (ax_epoch, EPOCH_LABEL, ERROR_LABEL, "test error against epochs"),
        (ax_loss, TIME_LABEL, LOSS_LABEL, "training loss (moving average, all learners)"),
    ):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_sigma.set_title("staleness distribution (applied gradients)")
    ax_sigma.grid(alpha=0.3)
    if len(dumps) <= MAX_LEGEND_ENTRIES:
        for ax in (ax_time, ax_sigma):
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
    return fig


def save_compare_figure(dumps: Sequence[Dump], names: Sequence[str], path: Path) -> Path:
    """Write :func:`compare_figure` to ``path`` (PNG, PDF or SVG by its suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    compare_figure(dumps, names).savefig(path, dpi=120)
    return path
