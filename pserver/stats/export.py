"""``pserver-stats export RUN --csv DIR``: the dump as CSV files a spreadsheet or R reads.

One file per non-empty group (``test.csv``, ``train.csv``, ``updates.csv``, …: the columns of
docs/stats.md, a vector clock as space-separated timestamps; the ``staleness`` group's rows as
``staleness_rows.csv``), ``staleness.csv`` (σ, count, probability over the applied
contributions) and ``run.csv``: one row with the run's facts
(:data:`pserver.stats.tables.RUN_COLUMNS`) and its whole configuration as ``config.<key>``
columns, so the ``run.csv`` of several runs concatenate into one table.

Plain :mod:`csv`: export needs no pandas. Floats are written with ``repr`` (exact round trip).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pserver.dump.reader import Dump
from pserver.dump.schema import MODEL_WEIGHTS
from pserver.stats.tables import flatten, group_table, run_facts, staleness_distribution

MODEL_GROUP = MODEL_WEIGHTS.split("/")[0]
#: file names that are not ``<group>.csv``: ``staleness.csv`` is the distribution of σ
FILE_NAMES = {"staleness": "staleness_rows.csv"}


def cell(value: Any) -> Any:
    """A CSV cell: numpy scalars as Python numbers, tuples as ``[a,b]``, None as empty."""
    if value is None:
        return ""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(str(cell(v)) for v in value) + "]"
    return value


def write_columns(path: Path, columns: Mapping[str, Sequence[Any]]) -> Path:
    """Write equal-length columns as a CSV with a header row."""
    names = list(columns)
    n = min((len(v) for v in columns.values()), default=0)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for i in range(n):
            w.writerow([cell(columns[c][i]) for c in names])
    return path


def run_row(dump: Dump, label: str = "") -> dict[str, Any]:
    """:func:`~pserver.stats.tables.run_facts` plus ``config.<key>`` for every config key."""
    row = run_facts(dump, label)
    row.update({f"config.{k}": v for k, v in flatten(dump.config).items()})
    return row


def export_csv(dump: Dump, outdir: Path) -> list[Path]:
    """Write the CSV files of the module docstring into ``outdir``; their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    written = [write_columns(outdir / "run.csv", {k: [v] for k, v in run_row(dump).items()})]
    for name in dump.groups:
        if name == MODEL_GROUP:  # the final weight vector, not a table
            continue
        table = group_table(dump, name)
        if table and dump.rows(name):
            written.append(write_columns(outdir / FILE_NAMES.get(name, f"{name}.csv"), table))
    dist = staleness_distribution(dump)
    if dist["count"].size:
        written.append(write_columns(outdir / "staleness.csv", dist))
    return written
