"""Runs that differ only in their seed are one experiment: one row of ``pserver-stats compare``
(mean ± std over the seeds) and one curve with a band in its figure (issue 25, item 5).

Pure: dumps in, rows of plain values out (no pandas, no plotting). The figure's bands are in
:mod:`pserver.stats.compare_bands`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pserver.dump.reader import Dump
from pserver.stats.tables import (
    NOISE_KEYS,
    differing_keys,
    labels,
    run_config,
    run_facts,
)

#: config keys that only choose a seed: runs that differ in nothing else are one experiment
SEED_KEYS = frozenset({"run.seed"})
#: the per-run figures averaged over the seeds (``<column>_std`` holds their spread)
STAT_COLUMNS = (
    "epochs",
    "final_error",
    "best_error",
    "best_epoch",
    "wall_time_s",
    "mean_staleness",
    "max_staleness",
    "updates",
    "samples",
    "samples_per_s",
    "learners_lost",
)
#: the columns a grouped row adds to :data:`pserver.stats.tables.RUN_COLUMNS`
GROUP_COLUMNS = {
    "runs": "runs (seeds) in the row; its figures are their mean",
    "seeds": "the seeds of those runs",
    **{f"{c}_std": f"sample standard deviation of {c} over the seeds" for c in STAT_COLUMNS},
}


def without_seed(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config less its seed keys."""
    return {k: v for k, v in cfg.items() if k not in SEED_KEYS}


def seed_groups(configs: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Indices of the runs whose configs differ only in :data:`SEED_KEYS` (and bookkeeping,
    :data:`~pserver.stats.tables.NOISE_KEYS`): one list per experiment, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        kept = sorted((k, repr(v)) for k, v in cfg.items() if k not in NOISE_KEYS | SEED_KEYS)
        groups.setdefault(repr(kept), []).append(i)
    return list(groups.values())


def mean_std(values: Sequence[Any]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1) of the values a run has; std ``None`` for
    fewer than two, both ``None`` for none."""
    have = [float(v) for v in values if v is not None]
    if not have:
        return None, None
    return float(np.mean(have)), float(np.std(have, ddof=1)) if len(have) > 1 else None


def merge_facts(facts: Sequence[dict[str, Any]], seeds: Sequence[Any]) -> dict[str, Any]:
    """One row for the runs of an experiment: :data:`STAT_COLUMNS` as their mean with
    ``<column>_std``; the other columns from the first run (``dump``: every path)."""
    row = dict(facts[0])
    row["dump"] = " ".join(f["dump"] for f in facts)
    row["runs"], row["seeds"] = len(facts), tuple(seeds)
    for c in STAT_COLUMNS:
        row[c], row[f"{c}_std"] = mean_std([f[c] for f in facts])
    if len(facts) == 1:  # one run: its own figures, exactly as they are
        row.update({c: facts[0][c] for c in STAT_COLUMNS})
    return row


def comparison_rows(dumps: Sequence[Dump]) -> list[dict[str, Any]]:
    """One row per experiment (runs differing only in seed merged, :func:`merge_facts`) under
    the experiments' :func:`~pserver.stats.tables.labels`, then the value of each key in which
    they differ (``pserver-stats compare``, ``compare_frame``)."""
    configs = [run_config(d) for d in dumps]
    groups = seed_groups(configs)
    reps = [without_seed(configs[g[0]]) for g in groups]
    names = group_labels(dumps, groups)
    keys = differing_keys(reps)
    rows = []
    for g, rep, label in zip(groups, reps, names, strict=True):
        facts = [run_facts(dumps[i], label) for i in g]
        row = merge_facts(facts, [configs[i].get("run.seed") for i in g])
        row.update({k: rep.get(k) for k in keys})
        rows.append(row)
    return rows


def group_labels(dumps: Sequence[Dump], groups: Sequence[Sequence[int]]) -> list[str]:
    """A label per experiment: its differing keys (seed left out), ``(3 seeds)`` after it when
    it merges several runs; one experiment alone is its protocol name (one run: its path)."""
    configs = [run_config(d) for d in dumps]
    reps = [without_seed(configs[g[0]]) for g in groups]
    fallback = [
        str(dumps[g[0]].path) if len(g) == 1 else str(reps[k].get("protocol.name", "run"))
        for k, g in enumerate(groups)
    ]
    names = labels(reps, fallback)
    return [f"{n} ({len(g)} seeds)" if len(g) > 1 else n for n, g in zip(names, groups,
                                                                         strict=True)]
