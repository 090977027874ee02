"""What ``pserver-study`` writes into its output directory (docs/study.md, *Outputs*):

* ``table.md`` — the comparison (mean ± std over seeds, :func:`pserver.plan.study.table`) and the
  sweep (mean validation error of every rate, the chosen one marked); printed too;
* ``study.csv`` — the comparison, one row per strategy, ``*_mean`` and ``*_std`` columns;
* ``runs.csv`` — every run of both phases, one row each;
* ``error_vs_time.png``, ``error_vs_samples.png`` — test error against wall time and against
  samples, the mean over seeds at each test with a bar and a band of ± one standard deviation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pserver.job import study_runs as job
from pserver.plan import study as plan


def write_outputs(
    s: plan.Study,
    chosen: dict[str, float | None],
    sweep: list[plan.Run],
    finals: list[plan.Run],
    out: Path,
) -> None:
    runs_rows, curves, rows = [], {}, []
    for st in s.strategies:
        per_seed = []
        for run in (r for r in finals if r.strategy == st.label and job.finished(out, r)):
            m, curve = job.metrics(job.run_dir(out, run) / job.DUMP, s.target)
            per_seed.append(m)
            curves.setdefault(st.label, []).append(curve)
            runs_rows.append(run_row(run, m))
        rows.append((st.label, chosen[st.label], plan.aggregate(per_seed)))
    val = sweep_errors(sweep, out)
    runs_rows += [run_row(r, {"final_error": e}) for r, e in val.items()]
    text = plan.table(rows, s.target) + "\n\n" + sweep_table(s, chosen, val) + "\n"
    lost = [r.name for r in finals if job.diverged(out, r)]
    if lost:  # left out of the table above
        text += f"\nDiverged, left out of the table: {', '.join(lost)}\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text)
    job.write_csv(out / "study.csv", [csv_row(label, lr, agg) for label, lr, agg in rows])
    job.write_csv(out / "runs.csv", runs_rows)
    figures(curves, out)
    print(text, end="")
    print(f"written: {out / 'table.md'}, study.csv, runs.csv, error_vs_time.png, "
          "error_vs_samples.png")


def run_row(run: plan.Run, m: dict[str, Any]) -> dict[str, Any]:
    row = {"phase": run.phase, "strategy": run.strategy, "lr": run.lr, "seed": run.seed}
    return {**row, **{k: m.get(k) for k, _, _ in plan.COLUMNS}, "wall_time": m.get("wall_time")}


def csv_row(label: str, lr: float | None, agg: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": label, "lr": lr, "seeds": agg["seeds"],
                           "reached_target": agg["reached"]}
    for key, _, _ in plan.COLUMNS:
        row[f"{key}_mean"], row[f"{key}_std"] = agg[key]
    return row


def sweep_errors(sweep: list[plan.Run], out: Path) -> dict[plan.Run, float | None]:
    return {r: job.final_error(out, r) for r in sweep}


def sweep_table(s: plan.Study, chosen: dict[str, float | None],
                val: dict[plan.Run, float | None]) -> str:
    """Mean ± std of the final validation error per strategy and rate; * the chosen rate."""
    lines = ["| strategy | lr | validation error % | seeds |", "|---|---|---|---|"]
    for st in s.strategies:
        if not s.swept(st):
            continue
        for lr in st.lrs:
            errs = [e for r, e in val.items() if r.strategy == st.label and r.lr == lr]
            mark = " *" if chosen[st.label] == lr else ""
            text = plan.cell("final_error", *plan.mean_std(errs))
            done = sum(e is not None for e in errs)
            lines.append(f"| {st.label} | {lr:g}{mark} | {text} | {done}/{len(errs)} |")
    if len(lines) == 2:
        return "No learning-rate sweep (one rate per strategy)."
    return f"Sweep on data.validation = {s.validation} of the training set:\n\n" + "\n".join(lines)


def band(curves: list[dict[str, Any]], x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean error, std) over seeds at each test, up to the shortest seed's tests."""
    n = min(len(c["error"]) for c in curves)
    xs = np.array([c[x][:n] for c in curves], dtype=float).mean(axis=0)
    errs = np.array([c["error"][:n] for c in curves], dtype=float)
    std = errs.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(n)
    return xs, errs.mean(axis=0), std


def figures(curves: dict[str, list[dict[str, Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    for x, label, name in (("time", "wall time (s)", "error_vs_time.png"),
                           ("samples", "samples", "error_vs_samples.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (strategy, cs) in enumerate(curves.items()):
            if not cs or not all(c[x] for c in cs):
                continue
            xs, mean, std = band(cs, x)
            color = colors[(2 * i) % len(colors)]  # tab20's dark shades first: no reused colour
            ax.errorbar(xs, 100 * mean, yerr=100 * std, marker="o", ms=3, capsize=3,
                        color=color, label=f"{strategy} ({len(cs)} seeds)")
            if len(xs) > 1:  # one test (a one-epoch run) has no band to draw, only its bar
                ax.fill_between(xs, 100 * (mean - std), 100 * (mean + std), color=color,
                                alpha=0.2)
        ax.set_xlabel(label)
        ax.set_ylabel("test error (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
