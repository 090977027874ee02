"""Consistency checks of a finished dump: what must hold whatever the protocol, engine or timing.

Pure: a :class:`~pserver.dump.reader.Dump` in, a list of readable problems out (empty when the
dump is consistent). ``pserver-stats check`` runs it on a file; the randomized soak
(``scripts/soak.py``) runs it on every dump it produces. Each rule says which part of the
schema (``docs/stats.md``) it relies on:

* a clean end: ``finished`` and ``wall_time`` are set, the final model is finite (a simulated
  run, ``simulated`` attribute, has no model and NaN training losses: docs/simulation.md);
* every shard's updates advance its timestamp by one from 1 (Rudra §III's scalar clock), and
  each update's vector clock has ``n_gradients`` entries with ⟨σ⟩ = (i − 1) − mean(clock)
  (eq. 2);
* every applied gradient entered an update of its shard that exists, with
  σ = (i − 1) − timestamp ≥ 0; per update, the applied gradients number ``n_gradients``;
* every ``staleness`` row has σ ≥ 0, and where shards record ``gradients`` the ``staleness``
  rows are the applied ones with the same learner, shard, timestamp and σ;
* hardsync with full pulls never applies a stale gradient (σ = 0; with partial pulling a
  learner computes on kept copies, PSP-SGD Algorithm 1);
* the end-of-run rows agree with the streams: a shard's ``updates`` is its highest block
  timestamp; its first block (whose decisions the ``updates``/``gradients`` rows record) ends
  at the shard's last update with as many applied gradients as the rows; a learner's
  ``minibatches`` equals its ``train`` rows, numbered 0, 1, …; a resumed run (or one with
  periodic checkpoints) has one such row per part, and its last one, whose counts are the
  run's so far, is the one held to the streams (:func:`last_rows`);
* a lost learner (``learners_lost``, issue 22) has no end-of-run row, train steps 0, 1, … at
  most up to its ``last_step``, and λ drops by one per loss; a learner that trained and has
  no end row was lost (or the run did not finish);
* training reached the configured epochs (counted as ``run.epoch_basis`` says);
* tests are at increasing epochs with errors in [0, 1] and finite losses;
* PP-ASGD (``predictions/``, ``prediction_errors/``): a shard's prediction rows are its updates,
  one each, with S ≥ 0; a probe compares with the weights S + 1 updates later, and its
  ``error`` is √(dd − 2a·dm + a²·mm), a = Σ_{s=1}^{S+1} μ^s (``pserver.optim.prediction``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pserver.dump.reader import Dump
from pserver.optim.prediction import prediction_error

Problems = list[str]
#: Float tolerance of eq. (2)'s mean against the recomputed one (float64 of small integers).
TOL = 1e-6


def check_dump(dump: Dump) -> Problems:
    """Every problem found in ``dump``; an empty list means consistent."""
    problems: Problems = []
    for rule in RULES:
        problems.extend(rule(dump))
    return problems


def _finished(dump: Dump) -> Problems:
    out = [f"root attribute {k!r} missing: the run did not end cleanly"
           for k in ("finished", "wall_time") if k not in dump.attrs]
    w = dump.group("model").get("weights")
    if w is None and "simulated" in dump.attrs:  # pserver-sim computes no model
        return out
    if w is None:
        out.append("model/weights missing")
    elif not np.all(np.isfinite(w)):
        out.append(f"model/weights has {int(np.sum(~np.isfinite(w)))} non-finite values")
    return out


def _updates(dump: Dump) -> Problems:
    up = dump.group("updates")
    if not up:
        return []
    out: Problems = []
    shard, ts, n = up["shard"], up["timestamp"], up["n_gradients"]
    for s in np.unique(shard):
        seq = ts[shard == s]
        if not np.array_equal(seq, np.arange(1, len(seq) + 1)):
            out.append(f"shard {s}: update timestamps are not 1, 2, …, {len(seq)}")
    if np.any(n < 1):
        out.append(f"{int(np.sum(n < 1))} updates aggregate no gradient")
    clocks = up.get("vector_clock")
    if clocks is not None and len(clocks) == len(ts):
        width = (clocks != -1).sum(axis=1)
        bad = np.flatnonzero(width != n)
        if len(bad):
            out.append(f"{len(bad)} vector clocks do not have n_gradients entries "
                       f"(first: update row {bad[0]})")
        else:
            masked = np.where(clocks == -1, 0, clocks)
            mean = (ts - 1) - masked.sum(axis=1) / np.maximum(n, 1)
            off = np.flatnonzero(np.abs(mean - up["mean_staleness"]) > TOL)
            if len(off):
                out.append(f"{len(off)} updates' mean_staleness is not eq. (2) of their clock "
                           f"(first: row {off[0]})")
    return out


def _gradients(dump: Dump) -> Problems:
    g, up = dump.group("gradients"), dump.group("updates")
    if not g:
        return []
    out: Problems = []
    applied = g["update"] != -1
    sigma, ts, upd = g["staleness"][applied], g["timestamp"][applied], g["update"][applied]
    if np.any(sigma < 0):
        out.append(f"{int(np.sum(sigma < 0))} applied gradients have negative staleness")
    wrong = np.flatnonzero(sigma != (upd - 1) - ts)
    if len(wrong):
        out.append(f"{len(wrong)} applied gradients' staleness is not (i − 1) − timestamp")
    protocol = dump.config.get("protocol", {})
    full_pulls = protocol.get("pull_fraction", 1.0) >= 1.0  # partial pulls compute on old copies
    if protocol.get("name") == "hardsync" and full_pulls and np.any(sigma != 0):
        out.append(f"hardsync applied {int(np.sum(sigma != 0))} stale gradients (max σ "
                   f"{int(sigma.max())})")
    if up:
        out.extend(_gradients_match_updates(g, up, applied))
    return out


def _gradients_match_updates(g: dict, up: dict, applied: np.ndarray) -> Problems:
    out: Problems = []
    for s in np.unique(up["shard"]):
        mine = up["shard"] == s
        n = up["n_gradients"][mine]
        entered = g["update"][applied & (g["shard"] == s)]
        counts = np.bincount(entered, minlength=len(n) + 1)
        if len(counts) > len(n) + 1 or np.any(counts[0] != 0):
            out.append(f"shard {s}: gradients entered updates the shard never made")
        elif not np.array_equal(counts[1:], n):
            out.append(f"shard {s}: applied gradients per update differ from n_gradients")
    return out


def last_rows(group: dict, *keys: str) -> dict:
    """``group``'s columns cut to the last row of each ``keys`` value: the end-of-run rows of a
    run in parts (``--resume``, ``run.checkpoint_interval``) come once per part, and their
    counts (minibatches, timestamps, gradients applied) are cumulative."""
    if not group or any(k not in group for k in keys):
        return group
    ids = list(zip(*(group[k].tolist() for k in keys), strict=True))
    last = {key: i for i, key in enumerate(ids)}
    keep = np.array(sorted(last.values()), dtype=np.int64)
    return {name: col[keep] for name, col in group.items()}


def _end_rows(dump: Dump) -> Problems:
    """The end-of-run rows against the streams. A shard's ``updates``/``gradients`` rows are
    those of its first block (docs/stats.md); its other blocks see the same pushes but may
    take gradients apart (a tree's aggregator relays each block's sum on its own; PSP's
    freshness is per block), so only the first block is held to the rows, and ``servers/updates``
    to the highest block timestamp."""
    out: Problems = []
    up = dump.group("updates")
    servers = last_rows(dump.group("servers"), "shard")
    blocks = last_rows(dump.group("blocks"), "block")
    last = {int(s): int(up["timestamp"][up["shard"] == s].max())
            for s in np.unique(up.get("shard", []))}
    if not blocks:
        return out
    highest = {int(s): int(blocks["timestamp"][blocks["shard"] == s].max())
               for s in np.unique(blocks["shard"])}
    for s, n in zip(servers.get("shard", []), servers.get("updates", []), strict=True):
        if n != highest.get(int(s), 0):
            out.append(f"servers/updates of shard {s} is {n}, its highest block timestamp "
                       f"{highest.get(int(s), 0)}")
    g = dump.group("gradients")
    for s in highest:
        mine = np.flatnonzero(blocks["shard"] == s)
        first = mine[np.argmin(blocks["block"][mine])]
        ts, applied = int(blocks["timestamp"][first]), int(blocks["applied"][first])
        if ts != last.get(s, 0):
            out.append(f"block {blocks['block'][first]}, the first of shard {s}, ends at "
                       f"timestamp {ts}, the shard's updates at {last.get(s, 0)}")
        rows = int(np.sum((g["shard"] == s) & (g["update"] != -1))) if g else applied
        if applied != rows:
            out.append(f"block {blocks['block'][first]}, the first of shard {s}, applied "
                       f"{applied} gradients, the shard's gradient rows say {rows}")
    return out


def _learners(dump: Dump) -> Problems:
    out: Problems = []
    train, learners = dump.group("train"), last_rows(dump.group("learners"), "learner")
    counts: dict[int, int] = {}
    for lr, mb in zip(learners.get("learner", []), learners.get("minibatches", []), strict=True):
        counts[int(lr)] = max(counts.get(int(lr), 0), int(mb))
    for lr, mb in counts.items():
        steps = np.sort(train["step"][train["learner"] == lr]) if train else np.array([])
        if len(steps) != mb or not np.array_equal(steps, np.arange(len(steps))):
            out.append(f"learner {lr}: {mb} minibatches but train steps "
                       f"{_span(steps)}")
    simulated = "simulated" in dump.attrs  # pserver-sim: loss NaN, nothing was computed
    if train and not simulated and not np.all(np.isfinite(train["loss"])):
        out.append(f"{int(np.sum(~np.isfinite(train['loss'])))} non-finite training losses")
    return out


def _lost(dump: Dump) -> Problems:
    """``learners_lost`` (issue 22): a lost learner has no end row and train steps 0 … its
    ``last_step``; λ drops by one per loss; a learner with train rows and no end row was lost."""
    lost, train = dump.group("learners_lost"), dump.group("train")
    ended = {int(x) for x in dump.group("learners").get("learner", [])}
    out: Problems = []
    gone = {int(x) for x in lost.get("learner", [])}
    for i, (lr, last) in enumerate(zip(lost.get("learner", []), lost.get("last_step", []),
                                       strict=True)):
        steps = np.sort(train["step"][train["learner"] == lr]) if train else np.array([])
        if int(lr) in ended:
            out.append(f"learner {lr} is recorded lost but has an end-of-run row")
        # its last train rows may have died with it, unsent: steps 0, 1, … up to last_step
        if len(steps) > int(last) + 1 or not np.array_equal(steps, np.arange(len(steps))):
            out.append(f"lost learner {lr}: last step {last} but train steps {_span(steps)}")
        want = int(dump.attrs.get("n_learners", 0)) - (i + 1)
        if "n_learners" in dump.attrs and int(lost["learners"][i]) != want:
            out.append(f"learners_lost row {i}: λ = {lost['learners'][i]} after the loss, "
                       f"expected {want}")
    if "finished" in dump.attrs and ended and train and "dropped_records" not in dump.attrs:
        silent = sorted({int(x) for x in train["learner"]} - ended - gone)
        if silent:
            out.append(f"learners {silent} trained but have no end-of-run row and are not "
                       "recorded lost")
    return out


def _span(steps: np.ndarray) -> str:
    return "none" if len(steps) == 0 else f"{len(steps)} rows, {steps.min()}..{steps.max()}"


def _epochs(dump: Dump) -> Problems:
    cfg = dump.config
    run, data = cfg.get("run", {}), cfg.get("data", {})
    blocks = last_rows(dump.group("blocks"), "block")
    train_size = _train_size(dump)
    if not blocks or "epochs" not in run or train_size is None:
        return []
    counted = blocks["applied"] + (blocks["dropped"] if run.get("epoch_basis") == "computed"
                                   else 0)
    need = int(run["epochs"]) * train_size
    protocol = cfg.get("protocol", {})
    # a bmuf or ma "gradient" is a model delta of τ local minibatches
    per = int(protocol.get("tau", 1)) if protocol.get("name") in ("bmuf", "ma") else 1
    short = np.flatnonzero(counted * int(data["batch_size"]) * per < need)
    return [f"block {blocks['block'][i]} stopped before {run['epochs']} epochs" for i in short]


def _train_size(dump: Dump) -> int | None:
    """Training samples per epoch: a test at epoch e records e · train_size samples."""
    t = dump.group("test")
    if not t or t["epoch"][-1] <= 0:
        return None
    return int(round(t["samples"][-1] / t["epoch"][-1]))


def _tests(dump: Dump) -> Problems:
    t = dump.group("test")
    if not t:
        return []
    out: Problems = []
    if np.any(np.diff(t["epoch"]) <= 0):
        out.append("tests are not at increasing epochs")
    if np.any((t["error"] < 0) | (t["error"] > 1)) or not np.all(np.isfinite(t["loss"])):
        out.append("a test error outside [0, 1] or a non-finite test loss")
    return out


def _predictions(dump: Dump) -> Problems:
    pr, up = dump.group("predictions"), dump.group("updates")
    out: Problems = []
    if pr:
        for s in np.unique(pr["shard"]):
            mine = pr["timestamp"][pr["shard"] == s]
            made = up["timestamp"][up["shard"] == s] if up else mine
            if not np.array_equal(mine, made):
                out.append(f"shard {s}: predictions/ rows are not one per update")
        if np.any(pr["steps"] < 0):
            out.append(f"{int(np.sum(pr['steps'] < 0))} predictions with S < 0")
    pe = dump.group("prediction_errors")
    if pe:
        if np.any(pe["horizon"] != pe["steps"] + 1):
            out.append("prediction probes not compared with the weights S + 1 updates later")
        want = np.array([prediction_error(dd, dm, mm, mu, int(s)) for dd, dm, mm, mu, s in zip(
            pe["dd"], pe["dm"], pe["mm"], pe["momentum"], pe["steps"], strict=True)])
        if not np.allclose(pe["error"], want, rtol=1e-6, atol=1e-12):
            out.append("prediction_errors/error is not √(dd − 2a·dm + a²·mm)")
    return out


def _staleness(dump: Dump) -> Problems:
    """``staleness/`` (docs/stats.md, *Staleness σ*): σ ≥ 0; where shards record gradients,
    its rows are the applied gradients, in order, with their σ (unless rows were dropped)."""
    st, g = dump.group("staleness"), dump.group("gradients")
    if not st:
        return []  # a dump from before the group existed
    out: Problems = []
    if np.any(st["staleness"] < 0):
        out.append(f"{int(np.sum(st['staleness'] < 0))} staleness rows have σ < 0")
    if g and "dropped_records" not in dump.attrs:
        applied = g["update"] != -1
        pairs = (("learner", "learner"), ("owner", "shard"), ("version", "timestamp"),
                 ("staleness", "staleness"))  # fmt: skip
        if not all(np.array_equal(st[a], g[b][applied]) for a, b in pairs):
            out.append("staleness rows are not the applied gradients (learner, shard, "
                       "timestamp, σ)")  # fmt: skip
    return out


RULES: tuple[Callable[[Dump], Problems], ...] = (
    _finished, _updates, _gradients, _staleness, _end_rows, _learners, _lost, _epochs, _tests,
    _predictions,
)
