"""The figure of ``pserver-stats compare``: several experiments overlaid, one colour each.

Four panels, as a paper would put them side by side (Rudra Figs. 3-8): test error against
wall time and against epochs, the training loss against wall time (a moving average over all
learners' minibatches), and the staleness distributions. An experiment of several seeds
(:mod:`pserver.stats.compare_seeds`) is its mean curve with a band of ± one standard deviation
over the seeds (:mod:`pserver.stats.compare_bands`). Readable with 12 runs and more: no colour
is used twice, and the legend sits below the panels, never over one. Built on
:class:`matplotlib.figure.Figure` (no global backend, headless), like :mod:`pserver.stats.plots`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from pserver.dump.reader import Dump
from pserver.stats.compare_bands import (
    Band,
    distinct_colors,
    error_band,
    loss_band,
    staleness_mix,
)
from pserver.stats.plots import (
    EPOCH_LABEL,
    ERROR_LABEL,
    LOSS_LABEL,
    TIME_LABEL,
    all_fresh_note,
    staleness_axes,
)
from pserver.stats.tables import applied_staleness

LEGEND_COLUMNS = 3  # entries per row of the legend below the panels, at most
LEGEND_CHARS = 170  # characters a row of the legend holds across the figure's width
BAND_ALPHA = 0.2


def _draw(ax: Axes, band: Band | None, color: Any, **line: Any) -> None:
    """The mean curve, and its band where there are several seeds."""
    if band is None:
        return
    ax.plot(band.x, band.mean, color=color, **line)
    if band.std.any():
        ax.fill_between(band.x, band.mean - band.std, band.mean + band.std, color=color,
                        alpha=BAND_ALPHA, lw=0)  # fmt: skip


def _staleness(ax: Axes, series: Sequence[Sequence[Dump]], colors: list[Any]) -> list[str]:
    """σ of every experiment on one integer axis (a run with σ = 0 throughout is one marker at
    0); returns each experiment's ⟨σ⟩ text for the legend."""
    probs: list[float] = []
    top, fresh, texts = 0, [], []
    for dumps, color in zip(series, colors, strict=True):
        x, p, mean, std = staleness_mix(dumps)
        if not x.size:
            texts.append("")
            continue
        top = max(top, int(x[-1]))
        probs.extend(p.tolist())
        if x.size == 1 and x[0] == 0:
            fresh.append(sum(applied_staleness(d).size for d in dumps))
            ax.plot([0], [1.0], marker="s", ms=7, ls="none", color=color, clip_on=False)
            texts.append(" (σ = 0 always)")
        else:
            ax.plot(x, p, marker="o", ms=3, lw=1, color=color, clip_on=False)
            texts.append(f": ⟨σ⟩ = {mean:.2f}" + (f" ± {std:.2f}" if std is not None else ""))
    if not probs:
        ax.text(0.5, 0.5, "no applied contributions", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip
    elif len(fresh) == len(series):
        all_fresh_note(ax, sum(fresh))
    staleness_axes(ax, top, probs)
    return texts


def grouped_figure(series: Sequence[Sequence[Dump]], names: Sequence[str]) -> Figure:
    """The four panels of the module docstring: one curve (and band) per experiment, each a
    list of runs differing only in seed, labelled by ``names``; the legend below."""
    texts_width = max((len(n) for n in names), default=0) + 24  # and the ⟨σ⟩ text
    ncols = max(1, min(LEGEND_COLUMNS, len(series), LEGEND_CHARS // texts_width))
    fig = Figure(figsize=(12, 8.5 + 0.3 * math.ceil(len(series) / ncols)), layout="constrained")
    (ax_time, ax_epoch), (ax_loss, ax_sigma) = fig.subplots(2, 2)
    colors = distinct_colors(len(series))
    for dumps, color in zip(series, colors, strict=True):
        _draw(ax_time, error_band(dumps, "time"), color, marker="o", ms=3)
        _draw(ax_epoch, error_band(dumps, "epoch"), color, marker="o", ms=3)
        _draw(ax_loss, loss_band(dumps), color, lw=1.2)
    texts = _staleness(ax_sigma, series, colors)
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
    ax_sigma.set_title("staleness distribution (applied contributions)")
    ax_sigma.grid(alpha=0.3)
    if any(len(d) > 1 for d in series):
        fig.suptitle("mean over seeds, band: ± one standard deviation")
    handles = [Line2D([], [], color=c, marker="o", ms=4) for c in colors]
    fig.legend(handles, [f"{n}{t}" for n, t in zip(names, texts, strict=True)],
               loc="outside lower center", ncols=ncols,
               fontsize="small")  # fmt: skip
    return fig


def compare_figure(dumps: Sequence[Dump], names: Sequence[str]) -> Figure:
    """:func:`grouped_figure` with one run per curve."""
    return grouped_figure([[d] for d in dumps], names)


def save_compare_figure(series: Sequence[Sequence[Dump]], names: Sequence[str],
                        path: Path) -> Path:  # fmt: skip
    """Write :func:`grouped_figure` to ``path`` (PNG, PDF or SVG by its suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    grouped_figure(series, names).savefig(path, dpi=120)
    return path
