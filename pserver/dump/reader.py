"""Reading a statistics dump back, and the numbers ``pserver-stats summary`` prints.

The summary functions are pure (arrays in, plain dicts out) so they are tested on hand-made
dumps without HDF5. Any group may be missing or empty (a run killed early, a run without tests).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pserver.errors import PserverError

VERSION_ATTR = "pserver_version"  # every dump has it; its absence means "not a pserver dump"


class DumpError(PserverError):
    """A statistics dump that is missing, not HDF5, or not written by pserver."""


@dataclass
class Dump:
    """A whole dump in memory: each group as a dict of numpy arrays (empty dict if absent)."""

    path: Path
    attrs: dict[str, Any]
    groups: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    group_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        """The resolved run configuration (``{}`` if the dump has none)."""
        config = self.attrs.get("config", {})
        return config if isinstance(config, dict) else {}

    def group(self, name: str) -> dict[str, np.ndarray]:
        """The columns of a group by name (``{}`` if the dump has no such group)."""
        return self.groups.get(name, {})

    def rows(self, name: str) -> int:
        """Number of rows of a group (0 if it is absent)."""
        columns = self.group(name)
        return min((len(v) for v in columns.values()), default=0)


def _decode(value: Any) -> Any:
    """Undo the writer's encoding: bytes to str, JSON objects/arrays to dicts/lists."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _read_group(grp: h5py.Group) -> dict[str, np.ndarray]:
    """Read every dataset of a group, trimmed to a common row count.

    Columns of one group grow together; only a run killed between two column writes leaves
    them uneven, and then the rows present in every column are the ones that mean something.
    A member that is not a numeric column (1-D, or the 2-D vector clocks) is a broken dump.
    """
    columns = {}
    for name, ds in grp.items():
        if not isinstance(ds, h5py.Dataset):
            continue
        if ds.ndim not in (1, 2) or ds.dtype.kind not in "biuf":
            raise DumpError(
                f"{grp.file.filename}: {grp.name}/{name} is not a numeric column "
                f"(shape {ds.shape}, dtype {ds.dtype})"
            )
        columns[name] = ds[()]
    n = min((len(v) for v in columns.values()), default=0)
    return {name: values[:n] for name, values in columns.items()}


def _open(path: Path) -> h5py.File:
    if not path.exists():
        raise DumpError(f"no such dump file: {path}")
    if path.is_dir():
        raise DumpError(f"{path} is a directory, expected a stats.h5 dump file")
    if not h5py.is_hdf5(path):
        raise DumpError(f"{path} is not an HDF5 file (expected a pserver stats.h5 dump)")
    try:
        # No file lock: summarising the dump of a run that is still writing it is allowed.
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise DumpError(f"cannot open dump {path}: {exc}") from exc


def load_dump(path: str | Path) -> Dump:
    """Load a whole dump into memory; raises :class:`DumpError` with a readable message.

    A broken file (truncated, overwritten, not written by pserver) is a :class:`DumpError`
    too, whatever HDF5 says about it: the writer publishes only complete files
    (``pserver.dump.writer``), so such a file did not come from a flush.
    """
    path = Path(path)
    with _open(path) as f:
        try:
            return _load(path, f)
        except DumpError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise DumpError(f"cannot read dump {path}: it is damaged ({exc})") from None


def _load(path: Path, f: h5py.File) -> Dump:
    attrs = {key: _decode(value) for key, value in f.attrs.items()}
    if VERSION_ATTR not in attrs:
        raise DumpError(
            f"{path} is an HDF5 file but not a pserver dump "
            f"(no {VERSION_ATTR!r} root attribute)"
        )
    groups, group_attrs = {}, {}
    for name, grp in f.items():
        if isinstance(grp, h5py.Group):
            groups[name] = _read_group(grp)
            group_attrs[name] = {k: _decode(v) for k, v in grp.attrs.items()}
    return Dump(path=path, attrs=attrs, groups=groups, group_attrs=group_attrs)


def staleness_summary(staleness: Any) -> dict[str, Any]:
    """Mean, extremes, percentiles and the histogram of gradient staleness values.

    Percentiles use the inverted CDF, so ``p99`` is the smallest observed σ such that at least
    99 % of the gradients have staleness ≤ it (an integer, like σ itself).
    """
    values = np.asarray(staleness, dtype=np.int64).ravel()
    if values.size == 0:
        return {
            "count": 0,
            "mean": None,
            "min": None,
            "max": None,
            "p50": None,
            "p90": None,
            "p99": None,
            "histogram": {},
        }
    uniq, counts = np.unique(values, return_counts=True)
    pct = np.percentile(values, [50, 90, 99], method="inverted_cdf")
    return {
        "count": int(values.size),
        "mean": float(values.mean()),
        "min": int(uniq[0]),
        "max": int(uniq[-1]),
        "p50": int(pct[0]),
        "p90": int(pct[1]),
        "p99": int(pct[2]),
        "histogram": {int(v): int(c) for v, c in zip(uniq, counts, strict=True)},
    }


def staleness_bound(dump: Dump) -> int | None:
    """The 2n bound of Rudra §V-A: n-softsync keeps σ ≤ 2n, async (n = λ) σ ≤ 2λ."""
    protocol = dump.config.get("protocol", {})
    name = protocol.get("name", dump.attrs.get("protocol"))
    if name == "softsync" and "n" in protocol:
        return 2 * int(protocol["n"])
    if name == "async" and "n_learners" in dump.attrs:
        return 2 * int(dump.attrs["n_learners"])
    return None


def _gradients(dump: Dump) -> dict[str, Any]:
    grads = dump.group("gradients")
    n = dump.rows("gradients")
    if n == 0:
        return {"count": 0, "applied": 0, "dropped": 0, "staleness": staleness_summary([])}
    # Dropped gradients (update == -1) never entered a vector clock, so ⟨σ⟩ leaves them out.
    applied = grads["update"] != -1 if "update" in grads else np.ones(n, dtype=bool)
    stale = grads["staleness"][applied] if "staleness" in grads else np.zeros(0, np.int64)
    out: dict[str, Any] = {
        "count": n,
        "applied": int(applied.sum()),
        "dropped": int((~applied).sum()),
        "staleness": staleness_summary(stale),
    }
    if "learner" in grads and stale.size:
        _per_learner(out, stale, grads["learner"][applied], dump)
    return out


def applied_staleness(dump: Dump) -> tuple[np.ndarray, np.ndarray]:
    """(σ, learner) of every applied contribution: the one staleness measure of every strategy
    (docs/stats.md, *Staleness σ*), from the ``staleness`` group. A dump written before that
    group existed falls back on its applied ``gradients`` (the parameter-server family), else
    on the old ``exchanges/staleness`` column (SYNC, HYBRID)."""
    for group, keep in (("staleness", None), ("gradients", "update"), ("exchanges", None)):
        cols = dump.group(group)
        n = dump.rows(group) if "staleness" in cols else 0
        if n == 0:
            continue
        mask = cols[keep][:n] != -1 if keep in cols else np.ones(n, dtype=bool)
        learner = cols["learner"][:n] if "learner" in cols else np.zeros(n, np.int64)
        sigma = np.asarray(cols["staleness"][:n][mask], dtype=np.int64)
        return sigma, np.asarray(learner[mask], dtype=np.int64)
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


def exchange_staleness(dump: Dump) -> tuple[np.ndarray, np.ndarray]:
    """(σ, learner) of the learners-only strategies' contributions (SYNC, HYBRID, ADPSGD):
    :func:`applied_staleness` of a dump that has ``exchanges`` rows, else empty."""
    if not dump.rows("exchanges"):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return applied_staleness(dump)


def _staleness(dump: Dump) -> dict[str, Any]:
    """``summary["staleness"]``: σ over every applied contribution, whatever the strategy."""
    stale, who = applied_staleness(dump)
    out = staleness_summary(stale)
    if stale.size:
        _per_learner(out, stale, who, dump)
    return out


def _per_learner(out: dict[str, Any], stale: np.ndarray, who: np.ndarray, dump: Dump) -> None:
    """Add each learner's mean σ and the share within softsync's 2n bound (Rudra §V) to ``out``."""
    out["per_learner_mean"] = {int(lid): float(stale[who == lid].mean()) for lid in np.unique(who)}
    bound = staleness_bound(dump)
    if bound is not None:
        out["bound_2n"] = bound
        out["fraction_within_2n"] = float(np.mean(stale <= bound))


def _exchanges(dump: Dump) -> dict[str, Any]:
    stale, who = exchange_staleness(dump)
    out: dict[str, Any] = {"count": dump.rows("exchanges"), "staleness": staleness_summary(stale)}
    ex = dump.group("exchanges")
    if stale.size:
        out["per_learner_mean"] = {
            int(lid): float(stale[who == lid].mean()) for lid in np.unique(who)
        }
    if dump.rows("exchanges") and "wait_time" in ex:
        out["wait_time"] = float(np.sum(ex["wait_time"]))
    age = ex.get("partner_age", np.zeros(0, np.int64))[: dump.rows("exchanges")]
    if np.any(age >= 0):  # ADPSGD: the partner models' age, beside σ (not σ)
        out["partner_age"] = staleness_summary(age[age >= 0])
    drift = dump.group("drift")
    if dump.rows("drift") and "max_diff" in drift:
        out["max_drift"] = float(np.max(drift["max_diff"]))
    return out


def _updates(dump: Dump) -> dict[str, Any]:
    upd = dump.group("updates")
    n = dump.rows("updates")
    out: dict[str, Any] = {"count": n}
    if n and "mean_staleness" in upd:
        out["mean_staleness"] = float(np.mean(upd["mean_staleness"]))  # ⟨σ⟩ of eq. (2)
    if n and "n_gradients" in upd:
        out["mean_gradients_per_update"] = float(np.mean(upd["n_gradients"]))
    if n and "shard" in upd:
        shards, counts = np.unique(upd["shard"], return_counts=True)
        out["per_shard"] = {int(s): int(c) for s, c in zip(shards, counts, strict=True)}
    return out


def _learners(dump: Dump) -> dict[int, dict[str, Any]]:
    """Per-learner totals: the end-of-run ``learners`` rows, else sums over ``train`` rows.

    A run in parts (``--resume``, ``run.checkpoint_interval``) has one row per learner and
    part: the counts are cumulative (the last row's), the times are the part's (summed)."""
    table = dump.group("learners")
    if dump.rows("learners"):
        wanted = ("minibatches", "compute_time", "wait_time", "samples", "cpu_time", "run_time")
        keys = [k for k in wanted if k in table]
        out: dict[int, dict[str, Any]] = {}
        for i in range(dump.rows("learners")):
            row = {k: table[k][i].item() for k in keys}
            before = out.get(int(table["learner"][i]), {})
            for k in set(keys) & {"compute_time", "wait_time", "cpu_time", "run_time"}:
                row[k] += before.get(k, 0.0)
            out[int(table["learner"][i])] = row
        return out
    train = dump.group("train")
    out = {}
    if dump.rows("train") and "learner" in train:
        for lid in np.unique(train["learner"]):
            mine = train["learner"] == lid
            row: dict[str, Any] = {"minibatches": int(mine.sum())}
            for key in ("compute_time", "wait_time"):
                if key in train:
                    row[key] = float(train[key][mine].sum())
            out[int(lid)] = row
    return out


def _test(dump: Dump) -> dict[str, Any]:
    test = dump.group("test")
    n = dump.rows("test")
    if n == 0 or "error" not in test:
        return {"count": n}
    best = int(np.argmin(test["error"]))
    out = {
        "count": n,
        "final_error": float(test["error"][-1]),
        "best_error": float(test["error"][best]),
    }
    if "epoch" in test:
        out["final_epoch"] = float(test["epoch"][-1])
        out["best_epoch"] = float(test["epoch"][best])
    return out


def _wall_time(dump: Dump) -> tuple[float | None, bool]:
    """The recorded wall time, or (for a run that did not end cleanly) the last row's time."""
    if "wall_time" in dump.attrs:
        return float(dump.attrs["wall_time"]), False
    times = [
        float(np.max(cols["time"]))
        for cols in dump.groups.values()
        if "time" in cols and len(cols["time"])
    ]
    return (max(times), True) if times else (None, True)


def _samples(dump: Dump, learners: dict[int, dict[str, Any]]) -> int | None:
    if learners and all("samples" in row for row in learners.values()):
        return int(sum(row["samples"] for row in learners.values()))
    test = dump.group("test")
    if dump.rows("test") and "samples" in test:
        return int(test["samples"][-1])
    return None


def _learners_lost(dump: Dump) -> list[dict[str, Any]]:
    """The ``learners_lost`` rows, one dict each (empty when no learner was lost)."""
    g = dump.group("learners_lost")
    n = dump.rows("learners_lost") if g else 0
    return [{k: g[k][i].item() for k in g} for i in range(n)]


def summarize(dump: Dump) -> dict[str, Any]:
    """Everything ``pserver-stats summary`` reports, as a JSON-serialisable dict."""
    run_keys = (
        "protocol",
        "n_learners",
        "n_servers",
        "world_size",
        "pserver_version",
        "host",
        "started",
        "finished",
    )
    learners = _learners(dump)
    wall, estimated = _wall_time(dump)
    skipped = dump.group("skipped_tests").get("epoch", np.zeros(0))
    samples = _samples(dump, learners)
    return {
        "path": str(dump.path),
        "run": {k: dump.attrs[k] for k in run_keys if k in dump.attrs},
        "updates": _updates(dump),
        "gradients": _gradients(dump),
        "exchanges": _exchanges(dump),
        "staleness": _staleness(dump),  # the one measure of every strategy (docs/stats.md)
        "learners": learners,
        "test": _test(dump),
        "wall_time": wall,
        "wall_time_estimated": estimated,
        "samples": samples,
        "samples_per_s": samples / wall if samples is not None and wall else None,
        "learners_lost": _learners_lost(dump),
        "statistics_lost": {  # what the statistics server could not keep up with
            "dropped_records": int(dump.attrs.get("dropped_records_total", 0)),
            "skipped_tests": [int(e) for e in skipped],
        },
    }
