"""The figures of ``scripts/reproduce_rudra.py`` beyond ``pserver-stats compare``'s: Fig. 3
(⟨σ⟩ per update, the staleness distributions), Figs. 5-6 ((σ, μ, λ) trade-off curves) and
Fig. 7 (speed-ups). Each takes the script's outcomes and writes one PNG."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pserver.stats.plots import ERROR_LABEL, SIGMA_LABEL, TIME_LABEL, smooth, staleness_axes
from pserver.stats.runs import load_run


def staleness_figure(outcomes: Sequence[Any], path: Path) -> Path:
    """Fig. 3: (a) ⟨σ⟩ of eq. (2) per weight update (moving average over 20), a dashed line at
    n; (b) the distribution of σ for every n (log scale: the tail beyond 2n)."""
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    ax_a, ax_b = fig.subplots(1, 2)
    probs, top = [], 0
    for i, o in enumerate(o for o in outcomes if o.ok):
        color, n = f"C{i}", o.job.n
        upd = load_run(o.out_dir).group("updates")
        if len(upd.get("mean_staleness", ())):
            ts = upd["timestamp"]
            ax_a.plot(
                ts, smooth(upd["mean_staleness"], 20), color=color, lw=1, label=f"{n}-softsync"
            )
            ax_a.axhline(n, color=color, ls="--", lw=0.8)
        hist = o.sigma_hist
        total = sum(hist.values())
        xs = sorted(hist)
        p = [hist[x] / total for x in xs]
        ax_b.plot(xs, p, marker="o", ms=3, lw=1, color=color, clip_on=False, label=f"{n}-softsync")
        probs += p
        top = max(top, max(xs))
    ax_a.set_xlabel("weight update step (timestamp)")
    ax_a.set_ylabel("⟨σ⟩ of the update (weight updates, eq. 2)")
    ax_a.set_title("(a) average staleness per update; dashed: n")
    ax_a.yaxis.set_major_locator(MaxNLocator(integer=True))
    staleness_axes(ax_b, top, probs)
    ax_b.set_title("(b) staleness distribution")
    for ax in (ax_a, ax_b):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


def _by_protocol(outcomes: Sequence[Any], sigma_of: Callable[[Any], int]) -> dict[str, list[Any]]:
    """The finished sweep runs per protocol class: hardsync, 1-softsync, λ-softsync (λ = 1
    runs, hardsync by construction, belong to all three, as in Fig. 6)."""
    out: dict[str, list[Any]] = {"hardsync": [], "1-softsync": [], "λ-softsync": []}
    for o in outcomes:
        if not o.ok:
            continue
        s = sigma_of(o.job)
        if o.job.learners == 1:
            for runs in out.values():
                runs.append(o)
        else:
            out["hardsync" if s == 0 else "1-softsync" if s == 1 else "λ-softsync"].append(o)
    return out


def tradeoff_figure(outcomes: Sequence[Any], sigma_of: Callable[[Any], int], path: Path) -> Path:
    """Figs. 5-6: test error against training time per protocol; solid lines join equal μ
    (over λ), dotted lines equal λ (over μ)."""
    groups = _by_protocol(outcomes, sigma_of)
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    for ax, (name, runs) in zip(axes, groups.items(), strict=True):
        for key, style, label in (
            (lambda o: o.job.batch, "-", "μ"),
            (lambda o: o.job.learners, ":", "λ"),
        ):
            for i, value in enumerate(sorted({key(o) for o in runs})):
                line = sorted(
                    (o for o in runs if key(o) == value), key=lambda o: o.facts["wall_time_s"]
                )
                if len(line) < 2:
                    continue
                ax.plot(
                    [o.facts["wall_time_s"] for o in line],
                    [100 * o.facts["final_error"] for o in line],
                    style,
                    marker="o",
                    ms=4,
                    color=f"C{i}" if label == "μ" else "grey",
                    lw=1,
                    label=f"{label} = {value}",
                )
        for o in runs:
            ax.annotate(
                f"({sigma_of(o.job) if o.job.learners > 1 else 0},{o.job.batch},{o.job.learners})",
                (o.facts["wall_time_s"], 100 * o.facts["final_error"]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.set_title(f"{name}: (σ, μ, λ)")
        ax.set_xlabel(TIME_LABEL)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    axes[0].set_ylabel(ERROR_LABEL)
    fig.savefig(path, dpi=120)
    return path


def speedup_figure(outcomes: Sequence[Any], sigma_of: Callable[[Any], int], path: Path) -> Path:
    """Fig. 7: speed-up of the training time over (0, μ, 1) against λ, per protocol, for the
    small and the large μ."""
    groups = _by_protocol(outcomes, sigma_of)
    mus = sorted({o.job.batch for o in outcomes if o.ok and o.job.learners == 1})
    fig = Figure(figsize=(5.5 * max(len(mus), 1), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, max(len(mus), 1), squeeze=False)[0])
    for ax, mu in zip(axes, mus, strict=False):
        for name, runs in groups.items():
            line = sorted((o for o in runs if o.job.batch == mu), key=lambda o: o.job.learners)
            base = [o for o in line if o.job.learners == 1]
            if not base or len(line) < 2:
                continue
            t0 = base[0].facts["wall_time_s"]
            ax.plot(
                [o.job.learners for o in line],
                [t0 / o.facts["wall_time_s"] for o in line],
                marker="o",
                label=name,
            )
        ax.set_title(f"μ = {mu}: speed-up over (0, {mu}, 1)")
        ax.set_xlabel("learners λ")
        ax.set_ylabel("speed-up (× the λ = 1 time)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


__all__ = ["SIGMA_LABEL", "speedup_figure", "staleness_figure", "tradeoff_figure"]
