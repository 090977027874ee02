"""A dump as plain tables: the columns of each group, one row of facts per run, and the labels
that tell several runs apart (``pserver-stats compare``/``export``, :mod:`pserver.stats.frames`).

Pure: numpy in, dicts of numpy columns and plain values out; no pandas, no plotting. The pandas
API (:mod:`pserver.stats.frames`) and the CSV writer (:mod:`pserver.stats.export`) build on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pserver import strategies
from pserver.dump.reader import Dump, summarize
from pserver.dump.reader import applied_staleness as reader_staleness
from pserver.errors import PserverError

#: keys that differ between any two runs without saying anything about the experiment
NOISE_KEYS = frozenset(
    {
        "run.out_dir",
        "run.name",
        "run.overwrite",
        "run.log_level",
        "stats.progress",
        "stats.flush_interval",
        "stats.progress_every",
        "stats.tensorboard",
        "cluster.learners",  # 0 means "the ranks left": λ itself is n_learners
    }
)
#: how a label writes a key; other keys by their last component (the whole key if ambiguous)
SHORT = {"n_learners": "λ", "data.batch_size": "μ", "protocol.n": "n", "optim.lr": "α0"}
LEARNERS_KEY = "n_learners"  # λ from the dump's root attribute (cluster.learners may be 0)

#: the columns of the per-run table, in order, with what each holds (docs/stats.md)
RUN_COLUMNS = {
    "label": "the run's differing config keys (pserver-stats compare)",
    "dump": "path of the dump",
    "protocol": "protocol name",
    "learners": "λ, the number of learners",
    "epochs": "epochs at the last test",
    "final_error": "test error of the last test (fraction)",
    "best_error": "lowest test error (fraction)",
    "best_epoch": "epoch of the lowest test error",
    "wall_time_s": "seconds from start to end (estimated from the last row if unclean)",
    "mean_staleness": "⟨σ⟩ over the applied contributions (docs/stats.md, Staleness σ)",
    "max_staleness": "largest σ of an applied contribution",
    "updates": "weight updates (all shards)",
    "samples": "training samples processed",
    "samples_per_s": "training samples per second of wall time",
    "learners_lost": "learners lost while the run went on (issue 22; λ counts them)",
}


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"protocol": {"n": 2}}`` -> ``{"protocol.n": 2}``; lists become tuples (hashable)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


def run_config(dump: Dump) -> dict[str, Any]:
    """The dump's flat config plus λ (``n_learners``), which the config may leave at 0."""
    flat = flatten(dump.config)
    if LEARNERS_KEY in dump.attrs:
        flat[LEARNERS_KEY] = int(dump.attrs[LEARNERS_KEY])
    return flat


def defaults() -> dict[str, Any]:
    """Every key's default, flattened as the dumps' configs are."""
    from pserver.plan.config import Config

    return flatten(Config().to_dict())


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys whose value is not the same in every config, leaving out :data:`NOISE_KEYS`; in
    the configs' key order, ``protocol.name`` first. A key missing from a config (a dump written
    before the key existed) counts as its default, which is what that run did; a key no
    version knows counts as a value of its own."""
    keys: dict[str, None] = {}
    for cfg in configs:
        keys.update(dict.fromkeys(cfg))
    missing, known = object(), defaults()
    differ = [
        k
        for k in keys
        if k not in NOISE_KEYS
        and len({repr(c.get(k, known.get(k, missing))) for c in configs}) > 1
    ]
    return sorted(differ, key=lambda k: (k != "protocol.name", list(keys).index(k)))


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """How each key is written in a label: :data:`SHORT`, else its last component when no
    other key in ``keys`` ends the same, else the whole key."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {
        k: SHORT.get(k, tail if last.count(tail) == 1 else k)
        for k, tail in zip(keys, last, strict=True)
    }


def _value(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def uses(cfg: Mapping[str, Any], key: str) -> bool:
    """Whether the run's strategy reads ``key`` (``protocol.n`` means nothing to async); keys
    outside ``protocol.*`` and strategies this version does not know count as read."""
    section, _, name = key.partition(".")
    if section != "protocol" or name == "name":
        return True
    try:
        return strategies.lookup(str(cfg.get("protocol.name"))).uses(name)
    except PserverError:
        return True


def labels(configs: Sequence[Mapping[str, Any]], fallback: Sequence[str]) -> list[str]:
    """One label per run from its differing keys: ``softsync n=2 λ=8``; the protocol name is
    written bare. Runs whose configs are all equal are labelled by ``fallback`` (their paths)."""
    keys = differing_keys(configs)
    if not keys:
        return list(fallback)
    names = short_names(keys)
    out = []
    for cfg in configs:
        parts = []
        for k in keys:
            if k not in cfg or not uses(cfg, k):
                continue
            parts.append(_value(cfg[k]) if k == "protocol.name" else f"{names[k]}={_value(cfg[k])}")
        out.append(" ".join(parts))
    if len(set(out)) < len(out):  # equal labels would merge lines: tell them apart by path
        out = [f"{lab} ({fb})" for lab, fb in zip(out, fallback, strict=True)]
    return out


def run_facts(dump: Dump, label: str = "") -> dict[str, Any]:
    """One row of :data:`RUN_COLUMNS` for the dump (``None`` where the dump has no figure)."""
    s = summarize(dump)
    st, test, upd = s["staleness"], s["test"], s["updates"]
    return {
        "label": label or str(dump.path),
        "dump": str(dump.path),
        "protocol": s["run"].get("protocol"),
        "learners": s["run"].get("n_learners"),
        "epochs": test.get("final_epoch"),
        "final_error": test.get("final_error"),
        "best_error": test.get("best_error"),
        "best_epoch": test.get("best_epoch"),
        "wall_time_s": s["wall_time"],
        "mean_staleness": st["mean"],
        "max_staleness": st["max"],
        "updates": upd["count"],
        "samples": s["samples"],
        "samples_per_s": s["samples_per_s"],
        "learners_lost": len(s["learners_lost"]),
    }


def clock_strings(clocks: np.ndarray) -> list[str]:
    """Rows of a -1-padded vector-clock array as space-separated timestamps (for a CSV cell)."""
    return [" ".join(str(int(t)) for t in row if t != -1) for row in np.asarray(clocks)]


def group_table(dump: Dump, name: str) -> dict[str, Any]:
    """The columns of group ``name`` (``{}`` if absent); 2-D clock columns as strings."""
    out: dict[str, Any] = {}
    for col, values in dump.group(name).items():
        out[col] = clock_strings(values) if np.ndim(values) == 2 else values
    return out


def applied_staleness(dump: Dump) -> np.ndarray:
    """σ of every applied contribution, whatever the strategy (docs/stats.md, *Staleness σ*;
    :func:`pserver.dump.reader.applied_staleness`)."""
    return reader_staleness(dump)[0]


def staleness_distribution(dump: Dump) -> dict[str, np.ndarray]:
    """Every σ from 0 to the largest seen, its count and probability (zeros included)."""
    sigma = applied_staleness(dump)
    counts = np.bincount(sigma) if sigma.size else np.zeros(0, np.int64)
    total = max(int(counts.sum()), 1)
    return {
        "staleness": np.arange(counts.size, dtype=np.int64),
        "count": counts.astype(np.int64),
        "probability": counts / total,
    }
