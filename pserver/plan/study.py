"""A study's grid and bookkeeping (``pserver-study``, docs/study.md), pure: no MPI, no files.

A study file names one run config, the strategies to compare and their overrides, the seeds,
λ and a learning-rate sweep. It expands into runs of two phases:

* **sweep** — every strategy × every rate of its sweep × the first ``sweep_seeds`` seeds, with
  ``data.validation`` held out of the training set and tested on instead of the test set;
* **final** — every strategy × every seed at the rate whose mean final validation error was
  lowest (ties: the first rate listed), tested on the test set.

A strategy with one rate (or none: the config's ``optim.lr``) has no sweep. Each run has its own
directory under the study's output, which makes the study resumable: a run whose dump is
finished is not run again. The table's arithmetic (mean ± sample standard deviation over seeds,
time and samples to a target error) is here too; reading dumps and drawing are the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pserver.errors import ConfigError
from pserver.plan.topology import world_size  # noqa: F401 - the study's -n, defined once there

SWEEP, FINAL = "sweep", "final"
STUDY_KEYS = {
    "config": str, "learners": int, "seeds": (int, list), "lr": list, "validation": float,
    "target": float, "timeout": float, "overrides": list, "sweep_seeds": int,
}
STRATEGY_KEYS = {"protocol": str, "overrides": list, "lr": list}
DEFAULT_SEEDS = 3


@dataclass(frozen=True)
class Strategy:
    label: str  # the table's row and the runs' directory
    overrides: tuple[str, ...]  # protocol.name=..., then the strategy's own
    lrs: tuple[float, ...]  # the sweep; () or one rate: no sweep


@dataclass(frozen=True)
class Study:
    config: str
    strategies: tuple[Strategy, ...]
    learners: int = 4
    seeds: tuple[int, ...] = tuple(range(DEFAULT_SEEDS))
    validation: float = 0.1
    target: float | None = None
    timeout: float = 1800.0
    overrides: tuple[str, ...] = ()
    sweep_seeds: int = 0  # 0: all seeds

    def swept(self, s: Strategy) -> bool:
        return len(s.lrs) > 1


@dataclass(frozen=True)
class Run:
    strategy: str
    phase: str  # SWEEP or FINAL
    seed: int
    lr: float | None  # None: the config's optim.lr
    overrides: tuple[str, ...] = field(default=(), repr=False)

    @property
    def name(self) -> str:
        """The run's directory under ``runs/`` of the study's output."""
        lr = "" if self.lr is None else f"-lr{self.lr:g}"
        return f"{self.strategy}/{self.phase}{lr}-seed{self.seed}"


def parse(raw: dict[str, Any]) -> Study:
    """The study of a study file's tables; every mistake is one :class:`ConfigError`."""
    unknown = sorted(set(raw) - {"study", "strategies"})
    if unknown:
        raise ConfigError(
            f"unknown table(s) {unknown}: a study file has [study] and [strategies.NAME]"
        )
    top = _typed(raw.get("study", {}), STUDY_KEYS, "study")
    if "config" not in top:
        raise ConfigError('study.config is missing: the run config every job starts from')
    tables = raw.get("strategies", {})
    if not isinstance(tables, dict) or not tables:
        raise ConfigError("no strategy: add a table [strategies.NAME] per strategy to compare")
    lrs = _rates(top.get("lr", []), "study.lr")
    strategies = tuple(_strategy(label, t, lrs) for label, t in tables.items())
    seeds = top.get("seeds", DEFAULT_SEEDS)
    seeds = tuple(range(seeds)) if isinstance(seeds, int) else tuple(seeds)
    bad = any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in seeds)
    if not seeds or bad or len(set(seeds)) < len(seeds):
        raise ConfigError(
            f"study.seeds = {top.get('seeds')!r}: expected a count >= 1 or distinct seeds >= 0"
        )
    study = Study(
        config=top["config"], strategies=strategies, learners=top.get("learners", 4),
        seeds=seeds, validation=float(top.get("validation", 0.1)),
        target=top.get("target"), timeout=float(top.get("timeout", 1800.0)),
        overrides=_strings(top.get("overrides", []), "study.overrides"),
        sweep_seeds=top.get("sweep_seeds", 0),
    )  # fmt: skip
    _check(study)
    return study


def _typed(table: Any, keys: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"[{where}] must be a table")
    for key, value in table.items():
        if key not in keys:
            raise ConfigError(f"unknown key {where}.{key}: expected one of {', '.join(keys)}")
        want = keys[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if isinstance(value, bool) or not isinstance(value, want):
            raise ConfigError(f"{where}.{key} = {value!r}: wrong type")
    return table


def _strings(values: list[Any], where: str) -> tuple[str, ...]:
    if any(not isinstance(v, str) or "=" not in v for v in values):
        raise ConfigError(f"{where} = {values!r}: expected overrides \"section.key=value\"")
    return tuple(values)


def _rates(values: list[Any], where: str) -> tuple[float, ...]:
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values)
    if not ok or len(set(values)) < len(values):
        raise ConfigError(f"{where} = {values!r}: expected distinct learning rates > 0")
    return tuple(float(v) for v in values)


def _strategy(label: str, table: Any, lrs: tuple[float, ...]) -> Strategy:
    where = f"strategies.{label}"
    t = _typed(table, STRATEGY_KEYS, where)
    if not label or "/" in label or label.startswith("."):
        raise ConfigError(f"[{where}]: a strategy's name becomes a directory: no '/'")
    overrides = _strings(t.get("overrides", []), f"{where}.overrides")
    if any(o.split("=", 1)[0].strip() in ("optim.lr", "run.seed") for o in overrides):
        raise ConfigError(f"{where}.overrides: optim.lr and run.seed are the study's (lr, seeds)")
    own = _rates(t["lr"], f"{where}.lr") if "lr" in t else lrs
    return Strategy(label, (f"protocol.name={t.get('protocol', label)}", *overrides), own)


def _check(s: Study) -> None:
    if s.learners < 1:
        raise ConfigError(f"study.learners = {s.learners}: expected λ >= 1")
    if not 0 < s.validation < 1:
        raise ConfigError(f"study.validation = {s.validation}: expected a share in (0, 1)")
    if s.target is not None and not 0 < s.target < 1:
        raise ConfigError(f"study.target = {s.target}: expected a test error in (0, 1)")
    if s.timeout <= 0:
        raise ConfigError(f"study.timeout = {s.timeout}: expected seconds > 0")
    if not 0 <= s.sweep_seeds <= len(s.seeds):
        raise ConfigError(f"study.sweep_seeds = {s.sweep_seeds}: expected 0 (all) .. "
                          f"{len(s.seeds)} (the seeds)")
    if any(o.split("=", 1)[0].strip() in ("optim.lr", "run.seed") for o in s.overrides):
        raise ConfigError("study.overrides: optim.lr and run.seed are the study's (lr, seeds)")


def job_overrides(study: Study, strategy: Strategy, run: Run) -> list[str]:
    """The overrides of one job after the config file: the study's, the strategy's, then λ,
    the seed, the rate and the split (the study's keys last, so that they win)."""
    out = [*study.overrides, *strategy.overrides, f"cluster.learners={study.learners}",
           f"run.seed={run.seed}"]
    if run.lr is not None:
        out.append(f"optim.lr={run.lr!r}")
    out.append(f"data.validation={study.validation if run.phase == SWEEP else 0.0!r}")
    return out


def sweep_runs(study: Study) -> list[Run]:
    seeds = study.seeds[: study.sweep_seeds or len(study.seeds)]
    return [
        Run(s.label, SWEEP, seed, lr)
        for s in study.strategies if study.swept(s)
        for lr in s.lrs
        for seed in seeds
    ]


def final_runs(study: Study, chosen: dict[str, float | None]) -> list[Run]:
    """Every strategy × seed at its chosen rate (``choose_rates``)."""
    return [Run(s.label, FINAL, seed, chosen[s.label]) for s in study.strategies
            for seed in study.seeds]


def choose_rates(study: Study, val_error: Callable[[Run], float | None]) -> dict[str, float | None]:
    """Per strategy, the rate of its sweep with the lowest mean final validation error over
    the sweep's seeds (a run without a result counts as missing; a rate with none loses);
    the only rate, or None (the config's), where there is no sweep."""
    runs = sweep_runs(study)
    chosen: dict[str, float | None] = {}
    for s in study.strategies:
        if not study.swept(s):
            chosen[s.label] = s.lrs[0] if s.lrs else None
            continue
        scores = {lr: mean_std([val_error(r) for r in runs
                                if r.strategy == s.label and r.lr == lr])[0] for lr in s.lrs}
        finite = {lr: v for lr, v in scores.items() if v is not None}
        chosen[s.label] = min(finite, key=finite.__getitem__) if finite else None
    return chosen


def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1) of the values that are not None; the
    deviation of one value is 0, of none None."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def to_target(errors: Sequence[float], xs: Sequence[float], target: float | None) -> float | None:
    """``xs`` (time or samples) at the first test whose error is ≤ ``target``; None if none."""
    if target is None:
        return None
    for err, x in zip(errors, xs, strict=True):
        if err <= target:
            return float(x)
    return None


#: the table's columns: (CSV name, header, format of one number)
COLUMNS = (
    ("final_error", "final test error %", "{:.2f}"),
    ("best_error", "best test error %", "{:.2f}"),
    ("time_to_target", "time to target s", "{:.1f}"),
    ("samples_to_target", "samples to target", "{:.0f}"),
    ("mean_staleness", "⟨σ⟩", "{:.2f}"),
    ("samples_per_s", "samples/s", "{:.0f}"),
)
PERCENT = {"final_error", "best_error"}


def aggregate(metrics: Sequence[dict[str, float | None]]) -> dict[str, Any]:
    """Mean and standard deviation of each column over a strategy's seeds, and how many seeds
    reached the target (time and samples to target: over those that did)."""
    out: dict[str, Any] = {"seeds": len(metrics)}
    for key, _, _ in COLUMNS:
        out[key] = mean_std([m.get(key) for m in metrics])
    out["reached"] = sum(m.get("time_to_target") is not None for m in metrics)
    return out


def cell(key: str, mean: float | None, std: float | None) -> str:
    if mean is None:
        return "–"
    if math.isinf(mean):  # a run that diverged (pserver.job.study_runs.final_error)
        return "diverged"
    fmt = dict((k, f) for k, _, f in COLUMNS)[key]
    scale = 100.0 if key in PERCENT else 1.0
    return f"{fmt.format(mean * scale)} ± {fmt.format((std or 0.0) * scale)}"


def table(rows: Sequence[tuple[str, float | None, dict[str, Any]]], target: float | None) -> str:
    """A Markdown table: one row per (strategy, chosen rate, :func:`aggregate`)."""
    head = ["strategy", "lr", "seeds", *(h for _, h, _ in COLUMNS)]
    if target is not None:
        head[5] = f"time to {target:.0%} s"
        head[6] = f"samples to {target:.0%}"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, lr, agg in rows:
        cells = [cell(k, *agg[k]) for k, _, _ in COLUMNS]
        if target is not None and agg["reached"] < agg["seeds"]:
            for i in (2, 3):  # time and samples to target: over the seeds that got there
                cells[i] += f" ({agg['reached']}/{agg['seeds']})"
        lr_text = "config" if lr is None else f"{lr:g}"
        lines.append("| " + " | ".join([label, lr_text, str(agg["seeds"]), *cells]) + " |")
    return "\n".join(lines)
