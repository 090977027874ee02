"""``pserver-stats compare RUN... [--out FILE.png] [--csv FILE]``: runs side by side.

Runs that differ only in their seed are one experiment (:mod:`pserver.stats.compare_seeds`):
one row, each figure the mean over the seeds with ``± std``. Each row is labelled by the config
keys in which the experiments differ (:func:`pserver.stats.tables.labels`); the table gives the
final and best test error, the wall time, ⟨σ⟩ and max σ over the applied contributions, and
samples per second; a column of lost learners when a run lost one (issue 22), and a line
per loss under the table. ``--csv`` writes the same rows (every column of
:data:`pserver.stats.tables.RUN_COLUMNS` and :data:`pserver.stats.compare_seeds.GROUP_COLUMNS`,
then each differing key); ``--out`` the four-panel figure of
:mod:`pserver.stats.compare_plots`, one curve and band per experiment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pserver.dump.reader import Dump, summarize
from pserver.stats.compare_seeds import comparison_rows, group_labels, seed_groups
from pserver.stats.export import write_columns
from pserver.stats.tables import run_config

#: (header, column, format) of the printed table
TABLE = (
    ("final err %", "final_error", "pct"),
    ("best err %", "best_error", "pct"),
    ("time s", "wall_time_s", ".1f"),
    ("⟨σ⟩", "mean_staleness", ".2f"),
    ("max σ", "max_staleness", "d"),
    ("samples/s", "samples_per_s", ".0f"),
    ("epochs", "epochs", "g"),
)
#: shown only when a run lost a learner: a loss changes λ (and so ⟨σ⟩ and samples/s) mid-run
LOST = ("lost", "learners_lost", "g")


def fmt(value: Any, spec: str) -> str:
    """A table cell: ``-`` for a figure the dump does not have, percentages of fractions."""
    if value is None:
        return "-"
    if spec == "pct":
        return f"{100 * value:.2f}"
    if spec == "d":  # a mean over seeds may be fractional
        return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
    return format(value, spec)


def cell(row: dict[str, Any], column: str, spec: str) -> str:
    """``mean ± std`` for an experiment of several seeds, else the run's figure."""
    std = row.get(f"{column}_std")
    if row.get("runs", 1) < 2 or std is None:
        return fmt(row[column], spec)
    return f"{fmt(row[column], spec)} ± {fmt(std, '.2f' if spec in ('d', 'g') else spec)}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The runs as a text table, one line per run (or experiment), the label first."""
    table = (*TABLE, LOST) if any(r.get("learners_lost") for r in rows) else TABLE
    header = ["run", *(h for h, _, _ in table)]
    cells = [[r["label"], *(cell(r, c, spec) for _, c, spec in table)] for r in rows]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *map(line, cells)])


def loss_lines(dumps: Sequence[Dump]) -> list[str]:
    """One line per learner a run lost: which, when, after which step, λ from then on."""
    out = []
    for d in dumps:
        for row in summarize(d)["learners_lost"]:
            out.append(
                f"lost: {d.path}: learner {row['learner']} (rank {row['rank']}) at "
                f"t={row['time']:.1f}s after step {row['last_step']}; λ = {row['learners']} "
                "from then on"
            )
    return out


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """The rows as a CSV, one line per run (columns of the first row)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_columns(path, {k: [r.get(k) for r in rows] for k in rows[0]})


def compare(dumps: Sequence[Dump], out: Path | None = None, csv: Path | None = None) -> str:
    """The printed table; the figure to ``out`` and the CSV to ``csv`` when given."""
    rows = comparison_rows(dumps)
    lines = [format_table(rows), *loss_lines(dumps)]
    if csv is not None:
        lines.append(f"table: {write_csv(rows, csv)}")
    if out is not None:
        from pserver.stats.compare_plots import save_compare_figure  # matplotlib only here

        groups = seed_groups([run_config(d) for d in dumps])
        series = [[dumps[i] for i in g] for g in groups]
        lines.append(f"figure: {save_compare_figure(series, group_labels(dumps, groups), out)}")
    return "\n".join(lines)
