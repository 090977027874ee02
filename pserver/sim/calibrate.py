"""``pserver-sim --calibrate RUN_DIR``: fit the ``[sim]`` cost model to a real run's dump.

What the dump measures and what is taken from it (docs/simulation.md, *Calibration*):

* ``compute``, ``compute_cv``: the ``train`` rows' ``compute_time``, less the emulated compute
  the run's ``[inject]`` added (``InjectPlan.compute_time_for``, which the simulation adds
  back from its own config), over the learners that were not the injected straggler;
* ``step_overhead``: per learner, the time between two consecutive ``train`` rows less the
  second row's compute and waits (the median, so a pause of the machine does not count);
* ``message_time``: the shard's busy time (``servers``: ``run_time − wait_time``) over the
  messages it handled (a push and a pull per gradient, a goodbye per learner), less the
  per-byte part of the pushes;
* ``latency``, ``latency_cv``: from the pulls (after a learner's first step, without those
  an ``[inject]`` delay held, which the simulation draws itself): a pull waits
  for the push's trip, the shard's handling of the push and the pull and the reply's trip,
  with the model's bytes each way, less the step's overhead, which runs before the pull is
  timed (under hardsync and psp only the pulls after the push that closed a round, which
  waited for no other learner); the mean of the pulls gives ``latency``, the interquartile
  range of the log of what a pull waited beyond the push's trip the reply's ``latency_cv``
  (:func:`log_iqr_cv`). On a
  machine with more ranks than cores these are mostly the operating system's wake-ups;
* ``start_time``: the median over learners of when their first minibatch began (its row's
  time less its compute and waits); ``end_time``: ``wall_time`` less the last ``train`` row's
  time (the last test and the dump).

One run of one model size cannot tell latency from bandwidth, nor per-message from per-byte
shard time: ``bandwidth`` and ``update_per_byte`` are kept from the config given (their
defaults), and the fit is of the rest given them. ``loop`` and ``data_time`` are not fitted
(the dump has no data-server timings; ``data_time = 0`` means the data server never held a
learner up, which the fetch waits of the dump show when it is so).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from pserver.dump.reader import Dump, load_dump
from pserver.errors import ConfigError
from pserver.plan.config import SimConfig, build
from pserver.plan.inject import InjectPlan
from pserver.strategies import lookup

#: the keys a fit sets (the others keep the config's values)
FITTED = ("compute", "compute_cv", "step_overhead", "latency", "latency_cv", "message_time",
          "start_time", "end_time")


def dump_path(run: str | Path) -> Path:
    p = Path(run)
    return p / "stats.h5" if p.is_dir() else p


def calibrate(run: str | Path, base: SimConfig | None = None) -> SimConfig:
    """The ``[sim]`` fitted to the dump of ``run`` (a run directory or its ``stats.h5``);
    ``base`` gives the keys not fitted (default: ``SimConfig()``)."""
    return fit(load_dump(dump_path(run)), base or SimConfig())


def fit(dump: Dump, base: SimConfig) -> SimConfig:
    """The fit of :func:`calibrate` on a loaded dump."""
    train = dump.group("train")
    if not dump.rows("train"):
        raise ConfigError(f"--calibrate {dump.path}: the dump has no train rows to fit")
    cfg = build(dump.config)  # the run's own config (types and defaults; not re-validated)
    plan = InjectPlan(
        compute_time=cfg.inject.compute_time, compute_per_sample=cfg.inject.compute_per_sample,
        slow_learner=cfg.inject.slow_learner, learner_factor=cfg.inject.learner_factor,
    )  # fmt: skip
    n = dump.rows("train")
    learner = train["learner"][:n]
    normal = learner != cfg.inject.slow_learner
    emulated = plan.compute_time_for(-2, cfg.data.batch_size)  # a learner that is not slow
    compute = train["compute_time"][:n][normal] - emulated
    mean = float(max(np.mean(compute), 0.0))
    cv = float(np.std(compute) / mean) if mean > 0 else 0.0
    overhead = step_overhead(train, n)
    nbytes = model_bytes(dump)
    message = message_time(dump, base, nbytes)
    keep = (train["step"][:n] > 0) & ~delayed(dump, train, n)
    if lookup(cfg.protocol.name).waits_for_update:  # a pull waits for the round: take those
        keep &= closers(dump, train, n)  # that did not (the learner whose push closed it)
    pulls = train["pull_time"][:n][keep]
    trips = 2 * nbytes / base.bandwidth + 2 * message + base.update_per_byte * nbytes
    mean_pull = float(np.mean(pulls)) if len(pulls) else 0.0
    # the step's overhead runs while the push travels: the pull is timed after it
    latency = max((mean_pull + overhead - trips) / 2.0, 0.0)
    # the spread goes on the reply's trip: what a pull waited beyond the push's trip
    latency_cv = log_iqr_cv(pulls + overhead - trips - latency)
    values = asdict(base)
    values.update(compute=mean, compute_cv=cv, step_overhead=overhead, latency=latency,
                  latency_cv=latency_cv, message_time=message, **ends(dump, train, n))
    from pserver.sim.calibrate_collective import latency as learners_latency

    linked = learners_latency(dump, base)  # SYNC, ADPSGD: from the learners' exchanges
    if linked is not None:
        values.update(latency=linked, latency_cv=0.0)
    return SimConfig(**values)


def closers(dump: Dump, train: dict, n: int) -> np.ndarray:
    """The ``train`` rows whose pull followed the push that closed a round (hardsync, psp):
    that pull waited for no other learner. A learner's j-th gradient row is its step j, so
    the pull after it is its step j + 1's."""
    g = dump.group("gradients")
    m = dump.rows("gradients")
    out = np.zeros(n, dtype=bool)
    if not m:
        return out
    learner, upd, t = g["learner"][:m], g["update"][:m], g["time"][:m]
    step = np.zeros(m, dtype=np.int64)
    for k in np.unique(learner):
        mine = np.flatnonzero(learner == k)
        step[mine[np.argsort(t[mine], kind="stable")]] = np.arange(len(mine))
    last: dict[int, int] = {}
    for i in np.flatnonzero(upd != -1):
        if int(upd[i]) not in last or t[i] >= t[last[int(upd[i])]]:
            last[int(upd[i])] = int(i)
    wanted = {(int(learner[i]), int(step[i]) + 1) for i in last.values()}
    pairs = zip(train["learner"][:n].tolist(), train["step"][:n].tolist(), strict=True)
    return np.fromiter((p in wanted for p in pairs), dtype=bool, count=n)


def delayed(dump: Dump, train: dict, n: int) -> np.ndarray:
    """The ``train`` rows whose pull had an injected delay (``delays``: a blocking learner's
    request r is the pull before its step r + 1): the simulation adds those delays itself."""
    d = dump.group("delays")
    if not dump.rows("delays"):
        return np.zeros(n, dtype=bool)
    held = set(zip(d["learner"].tolist(), (d["request"] + 1).tolist(), strict=True))
    pairs = zip(train["learner"][:n].tolist(), train["step"][:n].tolist(), strict=True)
    return np.fromiter((p in held for p in pairs), dtype=bool, count=n)


def log_iqr_cv(x: np.ndarray) -> float:
    """The coefficient of variation of the lognormal whose log has the interquartile range of
    ``log(x)`` (its positive values): the lognormal fitted by quantiles, so that a few pulls
    held up by a paused process (hundreds of ms among ms) do not make the tail heavy."""
    x = x[x > 0]
    if len(x) < 4:
        return 0.0
    q25, q75 = np.percentile(np.log(x), [25, 75])
    sigma = (q75 - q25) / 1.3489795  # the interquartile range of a unit normal
    return float(np.sqrt(np.expm1(sigma * sigma)))


def ends(dump: Dump, train: dict, n: int) -> dict[str, float]:
    """``start_time`` and ``end_time`` (module docstring)."""
    first = train["step"][:n] == 0
    begun = (train["time"][:n] - train["compute_time"][:n] - train["wait_time"][:n])[first]
    start = float(max(np.median(begun), 0.0)) if len(begun) else 0.0
    wall = float(dump.attrs.get("wall_time", 0.0))
    end = max(wall - float(np.max(train["time"][:n])), 0.0) if wall else 0.0
    return {"start_time": start, "end_time": end}


def step_overhead(train: dict, n: int) -> float:
    """The median over learners and steps of (time between rows − compute − waits)."""
    gaps = []
    learner, step, t = train["learner"][:n], train["step"][:n], train["time"][:n]
    busy = train["compute_time"][:n] + train["wait_time"][:n]
    for k in np.unique(learner):
        mine = np.flatnonzero(learner == k)
        mine = mine[np.argsort(step[mine])]
        gaps.append(np.diff(t[mine]) - busy[mine][1:])
    every = np.concatenate(gaps) if gaps else np.zeros(0)
    return float(max(np.median(every), 0.0)) if len(every) else 0.0


def model_bytes(dump: Dump) -> int:
    """The model's bytes: the ``blocks`` rows' sizes × the dtype's."""
    blocks = dump.group("blocks")
    dtype = np.dtype(dump.config.get("model", {}).get("dtype", "float32"))
    size = int(np.sum(blocks["size"])) if dump.rows("blocks") else 0
    return size * dtype.itemsize


def message_time(dump: Dump, base: SimConfig, nbytes: int) -> float:
    """The shard's busy seconds per message, less the per-byte part of its pushes."""
    servers = dump.group("servers")
    if not dump.rows("servers"):
        return base.message_time
    busy = float(np.sum(servers["run_time"] - servers["wait_time"]))
    pushes = dump.rows("gradients") + int(np.sum(servers["dropped_after_stop"]))
    messages = 2 * pushes + int(dump.attrs.get("n_learners", 0))
    busy -= base.update_per_byte * nbytes * pushes
    return max(busy / max(messages, 1), 0.0)


def overrides_of(sim: SimConfig) -> list[str]:
    """``sim.key=value`` overrides of the fitted keys."""
    return [f"sim.{k}={getattr(sim, k)!r}" for k in FITTED]


def fit_lines(sim: SimConfig, run: str | Path) -> list[str]:
    """What ``--calibrate`` prints: one line per key, the fitted ones marked."""
    out = [f"cost model fitted to {run}:"]
    for f in fields(sim):
        how = "fitted" if f.name in FITTED else "kept"
        out.append(f"  sim.{f.name} = {getattr(sim, f.name)!r}  ({how})")
    return out


def write_fit(sim: SimConfig, path: Path, run: str | Path) -> None:
    """The fitted ``[sim]`` table as TOML, for ``pserver-sim CONFIG`` with ``-c``-free reuse."""
    lines = [f"# [sim] fitted by pserver-sim --calibrate {run}", "[sim]"]
    for f in fields(sim):
        value = getattr(sim, f.name)
        lines.append(f'{f.name} = "{value}"' if isinstance(value, str) else f"{f.name} = {value!r}")
    path.write_text("\n".join(lines) + "\n")
