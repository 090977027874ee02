"""``pserver-sim --calibrate RUN_DIR``: fit the ``[sim]`` cost model to a real run's dump.

What the dump measures and what is taken from it (docs/simulation.md, *Calibration*):

* ``compute``, ``compute_cv``: the ``train`` rows' ``compute_time``, less the emulated compute
  the run's ``[inject]`` added (``InjectPlan.compute_time_for``, which the simulation adds
  back from its own config), over the learners that were not the injected straggler: the mean,
  at most the learner's CPU per minibatch less ``step_overhead`` (on shared cores the wall time
  of a compute is its CPU stretched, and the simulation stretches it itself), and the spread of
  each over the moving median of its neighbours in time (:func:`individual`: the part of the
  spread that is the learner's own), fitted by quantiles (:func:`log_iqr_cv`), then on shared
  cores scaled so that a simulation of the run has at most its σ p99 (:func:`match_tail`);
* ``step_overhead``: per learner, the time between two consecutive ``train`` rows less the
  second row's compute and waits (the median, so a pause of the machine does not count);
* ``message_time``: the shard's CPU time (``servers/cpu_time``) over the messages it handled
  (a push and a pull per gradient, a goodbye per learner), less the per-byte part of the
  pushes;
* ``latency``, ``latency_cv``: from the pulls (after a learner's first step, without those
  an ``[inject]`` delay held, which the simulation draws itself): a pull waits
  for the push's trip, the shard's handling of the push and the pull and the reply's trip,
  with the model's bytes each way, less the step's overhead, which runs before the pull is
  timed (under hardsync and psp only the pulls after the push that closed a round, which
  waited for no other learner); the mean of the pulls gives ``latency``, the interquartile
  range of the log of what a pull waited beyond the push's trip (over its neighbours' moving
  median, :func:`individual`) the reply's ``latency_cv`` (:func:`log_iqr_cv`). On a
  machine with more ranks than cores these are mostly the operating system's wake-ups;
* ``cores``: the run's ``cores`` attribute (the cores of the statistics server's node), else
  this machine's ``os.cpu_count()`` with a note on stderr, less the cores other jobs held
  (:func:`cores_of`); ``cpu``: the learners' CPU seconds
  (``learners/cpu_time``) per minibatch; ``other_cpu``: the statistics server's
  (``stats_cpu_time``) per minibatch, 0 where not recorded;
* ``start_time``: the median over learners of when their first minibatch began (its row's
  time less its compute and waits); ``end_time``: ``wall_time`` less the last ``train`` row's
  time (the last test and the dump).

One run of one model size cannot tell latency from bandwidth, nor per-message from per-byte
shard time: ``bandwidth`` and ``update_per_byte`` are kept from the config given (their
defaults), and the fit is of the rest given them. ``loop``, ``polls`` and ``data_time`` are
not fitted
(the dump has no data-server timings; ``data_time = 0`` means the data server never held a
learner up, which the fetch waits of the dump show when it is so).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import asdict, fields, replace
from pathlib import Path

import numpy as np

from pserver.dump.reader import Dump, load_dump, summarize
from pserver.errors import ConfigError
from pserver.plan.config import SimConfig, build
from pserver.plan.inject import InjectPlan
from pserver.strategies import lookup

MIN_WINDOW, MAX_WINDOW = 32, 256  # rows of individual()'s moving median
MAX_HELD = 0.9  # of the node's cores, at most, taken as held by other jobs
RATE_TOLERANCE = 0.05  # match_rate: a simulation of the calibration run this much slower
MATCH_STEPS = 7  # and the bisection's steps (the factor within 1/128)
TAIL_TOLERANCE = 0.1  # match_tail: a simulated σ p99 of the calibration run this much higher
#: the keys a fit sets (the others keep the config's values)
FITTED = ("compute", "compute_cv", "step_overhead", "latency", "latency_cv", "message_time",
          "start_time", "end_time", "cores", "cpu", "other_cpu")


def dump_path(run: str | Path) -> Path:
    p = Path(run)
    return p / "stats.h5" if p.is_dir() else p


def calibrate(run: str | Path, base: SimConfig | None = None) -> SimConfig:
    """The ``[sim]`` fitted to the dump of ``run`` (a run directory or its ``stats.h5``);
    ``base`` gives the keys not fitted (default: ``SimConfig()``). Prints a note on stderr
    where the dump does not record its node's cores (:func:`cores_of`)."""
    dump = load_dump(dump_path(run))
    _, note = cores_of(dump)
    if note:
        print(note, file=sys.stderr)
    return match_tail(dump, match_rate(dump, fit(dump, base or SimConfig())))


def match_rate(dump: Dump, sim: SimConfig) -> SimConfig:
    """``sim`` with its ``latency`` scaled down so that a simulation of the calibration run
    itself gives its samples/s, where with the fit as it is that simulation is more than
    ``RATE_TOLERANCE`` slower (else ``sim`` unchanged).

    On shared cores the pulls the latency is fitted from waited for a core as well as for the
    messages, and the processor-sharing queue of ``sim.cores`` makes that wait again: the fit
    would count it twice. Only the part of the latency the queue does not already make is kept
    (bisection on a factor of 0 … 1, ``MATCH_STEPS`` simulations of the run)."""
    if sim.cores <= 0.0:
        return sim
    target = summarize(dump).get("samples_per_s")
    if not target:
        return sim

    def rate(factor: float) -> float:
        return simulated_rate(dump, replace(sim, latency=sim.latency * factor))

    if rate(1.0) >= target * (1.0 - RATE_TOLERANCE):
        return sim
    lo, hi = 0.0, 1.0  # rate(lo) is the fastest the latency can make it
    if rate(lo) <= target:
        return replace(sim, latency=0.0)
    for _ in range(MATCH_STEPS):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if rate(mid) > target else (lo, mid)
    return replace(sim, latency=sim.latency * (lo + hi) / 2.0)


def match_tail(dump: Dump, sim: SimConfig) -> SimConfig:
    """``sim`` with its ``compute_cv`` scaled down so that a simulation of the calibration run
    itself has at most its 99th percentile of σ, where with the fit as it is that simulation's
    is more than ``TAIL_TOLERANCE`` higher (else ``sim`` unchanged).

    On a shared node a long compute is often the whole node descheduled, the shard too: the
    learner is late but no update happened meanwhile, and its σ does not grow. Drawn per
    learner, the same spread makes it late while the shard goes on: the simulated σ tail is
    longer than the real one (docs/simulation.md, *Validation*). The detrended fit
    (:func:`individual`) removes only the slow moments that span its window; the rest is
    found here, by bisection of a factor of 0 … 1 (``MATCH_STEPS`` simulations of the run)."""
    if sim.cores <= 0.0 or sim.compute_cv <= 0.0:
        return sim
    target = (summarize(dump).get("staleness") or {}).get("p99")
    if not target:
        return sim

    def p99(factor: float) -> float:
        return simulated(dump, replace(sim, compute_cv=sim.compute_cv * factor))["p99"]

    if p99(1.0) <= target * (1.0 + TAIL_TOLERANCE):
        return sim
    lo, hi = 0.0, 1.0
    for _ in range(MATCH_STEPS):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if p99(mid) <= target else (lo, mid)
    return replace(sim, compute_cv=sim.compute_cv * lo)


def simulated_rate(dump: Dump, sim: SimConfig) -> float:
    """samples/s of a simulation of the run of ``dump`` with the cost model ``sim``."""
    return simulated(dump, sim)["rate"]


def simulated(dump: Dump, sim: SimConfig) -> dict[str, float]:
    """samples/s (``rate``) and σ's 99th percentile (``p99``) of a simulation of the run of
    ``dump`` with the cost model ``sim``."""
    from pserver.sim.engine import simulate  # the engine does not import this module

    cfg = build(dump.config)
    cfg.sim = sim
    with tempfile.TemporaryDirectory(prefix="pserver-sim-fit-") as tmp:
        cfg.run.out_dir, cfg.run.overwrite = str(Path(tmp) / "run"), True
        out = simulate(cfg)
        s = summarize(load_dump(out.dump))
        return {"rate": float(s.get("samples_per_s") or 0.0),
                "p99": float((s.get("staleness") or {}).get("p99") or 0.0)}


def cores_of(dump: Dump) -> tuple[float, str | None]:
    """The cores the run's ranks had: its ``cores`` attribute (the statistics server's node),
    else this machine's count, with a note saying so (a dump older than the attribute, or one
    not from one node); less the cores other jobs held, where the dump records the node's busy
    CPU (``node_cpu_time``): that less this job's own CPU (learners, shards, statistics
    server), over the run's wall time, at most ``MAX_HELD`` of the cores."""
    recorded = dump.attrs.get("cores")
    if recorded:
        cores, note = float(recorded), None
    else:
        cores = float(os.cpu_count() or 1)
        note = (f"note: {dump.path} does not record its node's cores; sim.cores = "
                f"{cores:g}, this machine's count")
    held = held_by_others(dump)
    if held > 0.0:
        held = min(held, MAX_HELD * cores)
        cores -= held
        note = ((note + "; ") if note else "note: ") + (
            f"other jobs held {held:.2f} of the node's cores during the run: sim.cores = "
            f"{cores:.2f}")
    return cores, note


def held_by_others(dump: Dump) -> float:
    """Cores other jobs held on average over the run (0 where the dump cannot tell)."""
    node = dump.attrs.get("node_cpu_time")
    wall = float(dump.attrs.get("wall_time", 0.0) or 0.0)
    if node is None or wall <= 0.0:
        return 0.0
    own = float(dump.attrs.get("stats_cpu_time", 0.0))
    for group in ("learners", "servers"):
        if dump.rows(group):
            own += float(np.sum(dump.group(group)["cpu_time"]))
    return max((float(node) - own) / wall, 0.0)


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
    window = shared_window(int(dump.attrs.get("n_learners", 1)))
    cv = log_iqr_cv(individual(compute, train["time"][:n][normal], window))
    overhead = step_overhead(train, n)
    nbytes = model_bytes(dump)
    cores, _ = cores_of(dump)
    message = message_time(dump, base, nbytes, cpu=True)
    keep = (train["step"][:n] > 0) & ~delayed(dump, train, n)
    rounds = lookup(cfg.protocol.name).waits_for_update
    if rounds:  # a pull waits for the round: take those that did not (the learner whose push
        spread_of = round_lags_cv(dump, train, n, keep)  # closed it); the spread: all of them
        keep &= closers(dump, train, n)
    pulls = train["pull_time"][:n][keep]
    pull_times = train["time"][:n][keep]
    trips = 2 * nbytes / base.bandwidth + 2 * message + base.update_per_byte * nbytes
    mean_pull = float(np.mean(pulls)) if len(pulls) else 0.0
    # the step's overhead runs while the push travels: the pull is timed after it
    latency = max((mean_pull + overhead - trips) / 2.0, 0.0)
    # the spread goes on the reply's trip: what a pull waited beyond the push's trip
    if rounds and spread_of is not None:
        latency_cv = spread_of
    else:
        own = individual(pulls, pull_times, window) if len(pulls) else pulls
        latency_cv = log_iqr_cv(own + overhead - trips - latency)
    per = cpu_per_minibatch(dump)
    if per["cpu"] > 0.0:  # the compute is CPU on the shared cores: at most the learner's CPU
        mean = min(mean, max(per["cpu"] - overhead, 0.0))  # (its wall time is stretched)
    values = asdict(base)
    values.update(compute=mean, compute_cv=cv, step_overhead=overhead, latency=latency,
                  latency_cv=latency_cv, message_time=message, cores=cores,
                  **per, **ends(dump, train, n))
    from pserver.sim.calibrate_collective import latency as learners_latency

    linked = learners_latency(dump, base)  # SYNC, ADPSGD: from the learners' exchanges
    if linked is not None:
        values.update(latency=linked, latency_cv=0.0)
    return SimConfig(**values)


def cpu_per_minibatch(dump: Dump) -> dict[str, float]:
    """``cpu``: the learners' CPU seconds (``learners/cpu_time``) over their minibatches;
    ``other_cpu``: the statistics server's (``stats_cpu_time``) over the same, 0 where the
    dump does not record it."""
    learners = dump.group("learners")
    if not dump.rows("learners"):
        return {"cpu": 0.0, "other_cpu": 0.0}
    minibatches = max(int(np.sum(learners["minibatches"])), 1)
    cpu = float(np.sum(learners["cpu_time"])) / minibatches
    other = float(dump.attrs.get("stats_cpu_time", 0.0)) / minibatches
    return {"cpu": cpu, "other_cpu": other}


def shared_window(n_learners: int) -> int:
    """Rows of the moving median that :func:`individual` divides by: two per learner (about
    two steps of the whole job), within ``MIN_WINDOW`` … ``MAX_WINDOW`` (its memory is rows ×
    window)."""
    return min(max(2 * n_learners, MIN_WINDOW), MAX_WINDOW)


def individual(x: np.ndarray, t: np.ndarray, window: int) -> np.ndarray:
    """``x`` (a duration per row, rows at times ``t``) over the moving median of the
    ``window`` rows nearest in time: the part of its spread that is a learner's own.

    On a node whose ranks share the cores, a long compute or reply is mostly the whole node
    slow at that moment (another job, the shard and every learner descheduled together): the
    durations of all learners rise and fall together. Drawn per learner and step, that shared
    part would make one learner slow while the others are not, a larger staleness tail and a
    later last arrival of a round than the real runs show; the processor-sharing queue of
    ``sim.cores`` makes the shared slow-downs itself. Hence the lognormal spreads are fitted
    to what is left: each duration over the median of its neighbours in time."""
    if len(x) < 4 or window < 2:
        return x
    order = np.argsort(t, kind="stable")
    xs = x[order]
    w = min(window, len(xs))
    pad = np.pad(xs, (w // 2, w - 1 - w // 2), mode="edge")
    med = np.median(np.lib.stride_tricks.sliding_window_view(pad, w), axis=1)
    out = np.empty_like(x, dtype=np.float64)
    out[order] = np.where(med > 0, xs / np.where(med > 0, med, 1.0), 0.0)
    return out * float(np.median(x))  # the scale back (log_iqr_cv reads only the spread)


def round_lags_cv(dump: Dump, train: dict, n: int, keep: np.ndarray) -> float | None:
    """Under a strategy whose pulls wait for an update: the spread of the reply's latency that
    is each learner's own. Each kept row's pull end less the time of the last update before it
    (when the reply left, at the latest): the replies of one round leave together, so how far
    apart the learners see them is each one's own share of the latency (a whole node slow at
    that moment moves them all), which the closers' pulls alone, one per round, cannot tell
    from the rounds' differences. The lognormal's coefficient of variation from the pooled
    within-round variance of the log lags (one-way analysis of variance: Σ (log x − the
    round's mean)² / (rows − rounds), unbiased whatever the round's size). None where there
    are too few."""
    m = dump.rows("updates")
    if m < 2:
        return None
    ut = np.sort(dump.group("updates")["time"][:m])
    t, c = train["time"][:n], train["compute_time"][:n]
    fetch = train["wait_time"][:n] - train["pull_time"][:n] - train["push_time"][:n]
    end = (t - c - np.maximum(fetch, 0.0))[keep]
    which = np.searchsorted(ut, end, side="right") - 1
    ok = which >= 0
    lag, which = end[ok] - ut[which[ok]], which[ok]
    pos = lag > 0
    lag, which = np.log(lag[pos]), which[pos]
    rounds, inverse, counts = np.unique(which, return_inverse=True, return_counts=True)
    dof = len(lag) - len(rounds)
    if dof < 8:
        return None
    means = np.bincount(inverse, weights=lag) / counts
    var = float(np.sum((lag - means[inverse]) ** 2)) / dof
    return float(np.sqrt(np.expm1(var)))


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
    shard = g["shard"][:m]
    step = np.zeros(m, dtype=np.int64)
    for k in np.unique(learner):
        for s in np.unique(shard):  # a learner's j-th gradient row of each shard: its step j
            mine = np.flatnonzero((learner == k) & (shard == s))
            step[mine[np.argsort(t[mine], kind="stable")]] = np.arange(len(mine))
    last: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(upd != -1):
        key = (int(shard[i]), int(upd[i]))  # each shard's rounds
        if key not in last or t[i] >= t[last[key]]:
            last[key] = int(i)
    wanted = {(int(learner[i]), int(step[i]) + 1) for i in last.values()}
    pairs = zip(train["learner"][:n].tolist(), train["step"][:n].tolist(), strict=True)
    return np.fromiter((p in wanted for p in pairs), dtype=bool, count=n)


def delayed(dump: Dump, train: dict, n: int) -> np.ndarray:
    """The ``train`` rows whose pull had an injected delay (``delays``: a blocking learner's
    request r is the pull before its step r + 1): the simulation adds those delays itself."""
    d = dump.group("delays")
    if not dump.rows("delays"):
        return np.zeros(n, dtype=bool)
    # each step asks every block of the shard once (several blocks: request r is step
    # r // blocks + 1, a re-asked block aside)
    per = blocks_per_shard(dump)
    step = d["request"] // np.array([per.get(int(s), 1) for s in d["shard"]], dtype=np.int64)
    held = set(zip(d["learner"].tolist(), (step + 1).tolist(), strict=True))
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


def message_time(dump: Dump, base: SimConfig, nbytes: int, cpu: bool = False) -> float:
    """The shard's busy seconds per message, less the per-byte part of its pushes; with
    ``cpu``, its CPU seconds (``servers/cpu_time``: what it takes of the shared cores; its wall
    time busy is that stretched by the other ranks)."""
    servers = dump.group("servers")
    if not dump.rows("servers"):
        return base.message_time
    if cpu:
        busy = float(np.sum(servers["cpu_time"]))
    else:
        busy = float(np.sum(servers["run_time"] - servers["wait_time"]))
    # a shard's gradient rows are its first block's: each push of it came with one of each
    # of the shard's other blocks, and each carried its block's bytes (servers/bytes_in)
    per_shard = blocks_per_shard(dump)
    g = dump.group("gradients")
    pushes = sum(int(np.sum(g["shard"] == s)) * k for s, k in per_shard.items()) if g else 0
    pushes += int(np.sum(servers["dropped_after_stop"]))
    messages = 2 * pushes + int(dump.attrs.get("n_learners", 0)) * max(len(per_shard), 1)
    pushed = float(np.sum(servers["bytes_in"])) if "bytes_in" in servers else nbytes * pushes
    busy -= base.update_per_byte * pushed
    return max(busy / max(messages, 1), 0.0)


def blocks_per_shard(dump: Dump) -> dict[int, int]:
    """Each shard's count of blocks (the ``blocks`` rows); {0: 1} without them."""
    if not dump.rows("blocks"):
        return {0: 1}
    shards, counts = np.unique(dump.group("blocks")["shard"], return_counts=True)
    return {int(s): int(c) for s, c in zip(shards, counts, strict=True)}


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
