#!/usr/bin/env python3
"""Reproduce Table 1 and Fig. 4 of PSP-SGD ("Faster distributed synchronous SGD with weak
synchronization") on this machine.

The paper (§4.2) trains ResNet-50 on CIFAR-10 with 32 servers and 32 workers and compares

* ``Sync``                   naive synchronous SGD: c = λ = 32, b = 100 %;
* ``Sync+push:28``           partial pushing (§2.3): a block updates after c = 28 gradients;
* ``Sync+push:28+pull:0.9``  plus partial pulling (§3): a worker computes once b = 90 % of the
                             blocks are in, with its previous copy of the others;
* ``Sync+push:20+pull:0.75`` the "too aggressive" setting, which ends at a poor solution;

all with τ1 = τ2 = 0 (no timeouts), once without and once with simulated delays: 0.16 % of the
pull responses are held back 4 s. Table 1 lists c, b, the running time and the top-1 validation
error with delays; Fig. 4 plots the validation error against time. With delays, Sync took
199.97 s, push:28 164.97 s (-17 %), push:28+pull:0.9 139.95 s (-30 %) at about the same error.

Here the same four settings run on the MLP of ``examples/psp.toml`` (one hidden layer of 64)
on Fashion-MNIST (``--data``: the first ``--train-samples`` = 10,000 training images, tested on
the full t10k set; ``--data digits`` for the file's 8×8 digits) with pserver's
``psp`` protocol (Algorithm 1), λ learners and several server shards holding ``--blocks``
parameter blocks, so partial pulling has blocks to skip. ``inject.compute_time`` emulates a
bigger model (the rank sleeps, as beside a busy accelerator), so communication is not all.

Scaling to λ learners and N blocks: ``c`` is the paper's share of λ (28/32 and 20/32, rounded,
kept in 1..λ−1 and the aggressive one below the other) and ``b`` the largest k/N not above the
paper's share (90 % and 75 %) that still lets at least one block be skipped (k <= N−1).

Scaling the delays (unless ``--delay``/``--delay-prob`` are given): in the paper one 4 s delay
is about 2.6 % of the undelayed Sync run (§4.4: the delays prolong Sync "by nearly 30 %",
so undelayed Sync ≈ 200 / 1.3 ≈ 154 s) and the delays together cost Sync ≈ 30 %, i.e. about
0.30 / 0.026 ≈ 11.5 delays' worth. This script first measures Sync without delays (time T,
R pull requests: one per block per minibatch), then sets

    delay = 4 / 154 · T        prob = 11.5 / R

so that Sync with delays again runs ≈ 30 % longer and each delay again lasts ≈ 2.6 % of the
run. Which replies are delayed is a pure function of ``run.seed`` (``pserver.plan.inject``); repeat
r uses seed ``--seed + r``.

"Epochs" are counted as pserver counts them: a block stops once it has *applied* epochs × the
training set's samples, so a dropped gradient (Algorithm 1, server line 8) is work that must be
redone. The table also gives the time at which the learners had *computed* as many minibatches
as Sync needs (the paper's notion: every worker passes over its share of the data).

Two consequences worth knowing when reading the table:

* With τ1 = 0 a round closes at exactly the c-th gradient, so each round applies c gradients,
  not λ: reaching the same applied epochs takes λ/c times Sync's rounds, whatever the delays.
  ``--tau1``/``--tau2`` (Algorithm 1, lines 12 and 15) make the partial settings wait a little
  for the rest, so only a really late learner or block is left out.
* Because the delays are scaled to cost Sync ≈ 30 %, a setting that absorbed every delay at no
  other cost would save 1 − 1/1.3 ≈ 23 % against delayed Sync; the paper's 30 % also needs
  partial pushing to beat Sync without delays (139.95 s < ≈154 s).

The timings are wall-clock; other work on the machine shows in the load-average row. Repeats
(3 by default; repeat r runs with seed ``--seed + r``) are the outer loop; running time and
test error are printed as mean ± std over the seeds, the other rows as medians. The claims are
judged by ``scripts/claims.py`` on the delayed table: push + pull saves >= 20 % of Sync's time
(mean) with a Welch t-test p < 0.05 and a mean error within ``--same-margin`` (1 point) of
Sync's; the aggressive setting's mean error is above push + pull's with p < 0.05.

Example::

    python scripts/reproduce_psp.py                 # default: 4 learners, 4 shards, 8 blocks
    python scripts/reproduce_psp.py --repeats 5     # 5 seeds per cell (default 3)
    python scripts/reproduce_psp.py --tau1 0.01 --tau2 0.005   # with short timeouts
    python scripts/reproduce_psp.py --quick         # a small smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import claims
import numpy as np
from benchlib import (  # (scripts/ on sys.path)
    ROOT,
    Launcher,
    add_data_args,
    bench_parser,
    data_label,
    data_overrides,
    parse,
    pserver_run,
)
from benchlib import median as _median

CONFIG = ROOT / "examples" / "psp.toml"

#: Table 1 of the paper: c, b, running time (s) and top-1 validation error, with delays.
PAPER = {
    "Sync": (32, 1.00, 199.97, 0.1479),
    "Sync+push": (28, 1.00, 164.97, 0.1609),
    "Sync+push+pull": (28, 0.90, 139.95, 0.1565),
    "aggressive": (20, 0.75, 136.54, 0.2914),
}
PAPER_WORKERS = 32
PAPER_DELAY = 4.0  # s (§4.2)
PAPER_SYNC_DELAYED = 199.97  # s (Table 1)
PAPER_PROLONG = 0.30  # §4.4: delays prolong Sync "by nearly 30 %"
PAPER_SYNC_CLEAN = PAPER_SYNC_DELAYED / (1.0 + PAPER_PROLONG)  # ≈ 154 s
DELAY_SHARE = PAPER_DELAY / PAPER_SYNC_CLEAN  # one delay ≈ 2.6 % of the undelayed Sync run
DELAYS_WORTH = PAPER_PROLONG / DELAY_SHARE  # ≈ 11.5 delays' worth of stall in Sync

TARGET_SAVING = 0.20  # the claim: Sync+push+pull at least 20 % faster than Sync ...
TARGET_ERROR = 0.01  # ... with test error within one point (--same-margin)


@dataclass(frozen=True)
class Setting:
    """One column of Table 1: partial pushing c (of λ) and partial pulling b."""

    key: str
    label: str
    c: int
    b: float
    tau1: float = 0.0
    tau2: float = 0.0

    def overrides(self, n_learners: int) -> list[str]:
        return [
            "protocol.name=psp",
            f"protocol.c={0 if self.c >= n_learners else self.c}",  # 0 means λ: Sync
            f"protocol.pull_fraction={self.b!r}",
            f"protocol.tau1={self.tau1!r}",
            f"protocol.tau2={self.tau2!r}",
        ]


@dataclass
class RunResult:
    """What one run's dump says (``docs/stats.md``)."""

    setting: str
    scenario: str
    repeat: int
    seed: int
    out_dir: str
    ok: bool
    wall_time: float = math.nan
    test_error: float = math.nan
    test_time: list[float] = field(default_factory=list)
    test_errors: list[float] = field(default_factory=list)
    minibatches: int = 0
    rounds: float = math.nan  # updates per shard (median over shards): rounds to the epochs
    gradients: int = 0
    dropped: int = 0
    stale_fraction: float = math.nan
    stale_iterations: float = math.nan
    delays: int = 0
    minibatch_times: list[float] = field(default_factory=list)
    load: float = math.nan  # 1-minute load average at the end: other work on the machine
    message: str = ""


def paper_settings(n_learners: int, n_blocks: int, tau1: float, tau2: float) -> list[Setting]:
    """The four columns of Table 1 scaled from 32 workers and 32 blocks to λ and N."""
    if n_learners < 3:
        raise SystemExit("--learners must be >= 3 (two distinct partial-push thresholds c < λ)")
    if n_blocks < 3:
        raise SystemExit("--blocks must be >= 3 (two distinct partial-pull thresholds b < 1)")
    lam, n = n_learners, n_blocks
    c_push = min(lam - 1, max(2, round(PAPER["Sync+push"][0] / PAPER_WORKERS * lam)))
    c_aggr = min(c_push - 1, max(1, round(PAPER["aggressive"][0] / PAPER_WORKERS * lam)))
    k_pull = min(n - 1, math.floor(PAPER["Sync+push+pull"][1] * n + 1e-9))
    k_aggr = min(k_pull - 1, math.floor(PAPER["aggressive"][1] * n + 1e-9))
    b_pull, b_aggr = k_pull / n, k_aggr / n
    return [
        Setting("Sync", "Sync", lam, 1.0),
        Setting("Sync+push", f"Sync+push:{c_push}", c_push, 1.0, tau1),
        Setting(
            "Sync+push+pull", f"Sync+push:{c_push}+pull:{b_pull:g}", c_push, b_pull, tau1, tau2
        ),
        Setting("aggressive", f"Sync+push:{c_aggr}+pull:{b_aggr:g}", c_aggr, b_aggr, tau1, tau2),
    ]


def run_one(
    launcher: Launcher,
    args: argparse.Namespace,
    setting: Setting,
    scenario: str,
    repeat: int,
    extra: list[str],
) -> RunResult:
    """One ``mpiexec -n N pserver-run examples/psp.toml ...`` under a timeout; read its dump."""
    seed = args.seed + repeat
    out_dir = Path(args.out).parent / "runs" / f"{scenario}-{setting.key}-r{repeat}"
    n_ranks = args.servers + 2 + args.learners
    cmd = [
        *pserver_run(args),
        str(args.config),
        f"run.out_dir={out_dir}",
        "run.overwrite=true",
        f"run.seed={seed}",
        f"run.epochs={args.epochs}",
        f"cluster.servers={args.servers}",
        f"cluster.learners={args.learners}",
        f"blocks.count={args.blocks}",
        'blocks.split="size"',
        f"inject.compute_time={args.compute_time!r}",
        f"run.epoch_basis={args.epoch_basis}",
        "stats.progress=false",
        "run.log_level=warning",
        *setting.overrides(args.learners),
        *data_overrides(args),
        *args.set,
        *extra,
    ]
    result = RunResult(setting.key, scenario, repeat, seed, str(out_dir), ok=False)
    log = out_dir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    job = launcher.run(n_ranks, cmd, log=log, check=False)
    if job.reason:
        result.message = f"{job.reason} (log: {log})"
        return result
    if job.returncode != 0:
        result.message = f"exit status {job.returncode} after {job.seconds:.0f} s (log: {log})"
        return result
    result.load = os.getloadavg()[0]
    return read_dump(result, out_dir / "stats.h5")


def read_dump(result: RunResult, path: Path) -> RunResult:
    """Fill ``result`` from a finished dump: wall time, test error, drops, stale blocks."""
    from pserver.dump.reader import load_dump

    try:
        dump = load_dump(path)
    except Exception as e:  # noqa: BLE001 - a broken dump is reported, not fatal
        result.message = f"unreadable dump {path}: {e}"
        return result
    if "wall_time" not in dump.attrs:
        result.message = f"{path} has no wall_time: the run did not end cleanly"
        return result
    test, train, grads = dump.group("test"), dump.group("train"), dump.group("gradients")
    result.wall_time = float(dump.attrs["wall_time"])
    if len(test.get("error", ())):
        result.test_error = float(test["error"][-1])
        result.test_time = [float(t) for t in test["time"]]
        result.test_errors = [float(e) for e in test["error"]]
    result.minibatches = len(train.get("step", ()))
    result.minibatch_times = sorted(float(t) for t in train.get("time", ()))
    if len(train.get("stale_fraction", ())):
        stale = np.asarray(train["stale_fraction"], dtype=float)
        result.stale_fraction = float(stale.mean())
        result.stale_iterations = float((stale > 0).mean())
    updates = dump.group("updates")
    if len(updates.get("shard", ())):
        result.rounds = float(np.median(np.bincount(np.asarray(updates["shard"]))))
    result.gradients = len(grads.get("update", ()))
    result.dropped = int((np.asarray(grads.get("update", [])) == -1).sum())
    result.delays = dump.rows("delays")
    result.ok = True
    return result


def median(values: list[float]) -> float:
    """The median of the numbers that are not NaN (a failed run's figures are NaN)."""
    return _median(values, drop_nan=True)


def time_to_minibatches(run: RunResult, count: int) -> float:
    """When the learners together had computed ``count`` minibatches (NaN if never)."""
    if count <= 0 or len(run.minibatch_times) < count:
        return math.nan
    return run.minibatch_times[count - 1]


def summarize(
    settings: list[Setting], runs: list[RunResult], scenario: str
) -> dict[str, dict[str, Any]]:
    """Median over repeats of each cell of one scenario's table."""
    sync_runs = [r for r in runs if r.scenario == scenario and r.setting == "Sync" and r.ok]
    sync_count = int(median([r.minibatches for r in sync_runs])) if sync_runs else 0
    table: dict[str, dict[str, Any]] = {}
    for s in settings:
        cell = [r for r in runs if r.scenario == scenario and r.setting == s.key and r.ok]
        table[s.key] = {
            "label": s.label,
            "c": s.c,
            "b": s.b,
            "tau1": s.tau1,
            "tau2": s.tau2,
            "runs": len(cell),
            "failed": [
                r.message
                for r in runs
                if r.scenario == scenario and r.setting == s.key and not r.ok
            ],
            "time": median([r.wall_time for r in cell]),
            "error": median([r.test_error for r in cell]),
            "dropped": median([r.dropped for r in cell]),
            "dropped_share": median([r.dropped / r.gradients for r in cell if r.gradients]),
            "stale": median([r.stale_fraction for r in cell]),
            "stale_iterations": median([r.stale_iterations for r in cell]),
            "minibatches": median([r.minibatches for r in cell]),
            "rounds": median([r.rounds for r in cell]),
            "time_sync_minibatches": median([time_to_minibatches(r, sync_count) for r in cell]),
            "delays": median([r.delays for r in cell]),
            "load": median([r.load for r in cell]),
            "times": [r.wall_time for r in cell],
            "errors": [r.test_error for r in cell],
        }
    # "training time reduced by x %" (§4.3) and the change in test error, each against Sync of
    # the same repeat, then the median over repeats
    sync_by_repeat = {r.repeat: r for r in sync_runs}
    for s in settings:
        pairs = [
            (r, sync_by_repeat[r.repeat])
            for r in runs
            if r.scenario == scenario and r.setting == s.key and r.ok and r.repeat in sync_by_repeat
        ]
        table[s.key]["savings"] = [1.0 - r.wall_time / b.wall_time for r, b in pairs]
        table[s.key]["saving"] = median(table[s.key]["savings"])
        table[s.key]["error_delta"] = median([r.test_error - b.test_error for r, b in pairs])
    return table


def fmt(value: float, spec: str) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )


def spread(values: list[float], scale: float) -> str:
    """``mean ± std`` over the seeds (``scripts/claims.py``), "n/a" without a finished run."""
    s = claims.Sample.of("", values, scale=scale)
    if not s.n:
        return "n/a"
    return f"{s.mean * scale:.2f}" + (f" ± {s.std * scale:.2f}" if s.n > 1 else "")


def print_table(title: str, settings: list[Setting], table: dict[str, dict[str, Any]]) -> None:
    """Table 1's layout: one column per setting, rows c, b, running time, test error, ..."""
    width = max(14, *(len(s.label) + 2 for s in settings))
    rows: list[tuple[str, list[str]]] = [
        ("Partial pushing with c equals to", [str(table[s.key]["c"]) for s in settings]),
        ("Partial pulling with b equals to", [f"{table[s.key]['b']:.1%}" for s in settings]),
        ("Running time (s), mean ± std", [spread(table[s.key]["times"], 1) for s in settings]),
        ("Top-1 test error %, mean ± std", [spread(table[s.key]["errors"], 100) for s in settings]),
        (
            "Time saved vs Sync",
            [
                fmt(100 * table[s.key]["saving"], "+.1f") + " %" if s.key != "Sync" else "-"
                for s in settings
            ],
        ),
        (
            "Test error vs Sync (points)",
            [
                fmt(100 * table[s.key]["error_delta"], "+.2f") if s.key != "Sync" else "-"
                for s in settings
            ],
        ),
        (
            "Dropped gradients (share)",
            [
                fmt(table[s.key]["dropped"], ".0f")
                + f" ({fmt(100 * table[s.key]['dropped_share'], '.1f')} %)"
                for s in settings
            ],
        ),
        ("Mean stale-block fraction", [fmt(table[s.key]["stale"], ".3f") for s in settings]),
        (
            "Iterations with a stale block",
            [fmt(100 * table[s.key]["stale_iterations"], ".1f") + " %" for s in settings],
        ),
        ("Updates per shard (rounds)", [fmt(table[s.key]["rounds"], ".0f") for s in settings]),
        ("Minibatches computed", [fmt(table[s.key]["minibatches"], ".0f") for s in settings]),
        (
            "Time to Sync's minibatches (s)",
            [fmt(table[s.key]["time_sync_minibatches"], ".2f") for s in settings],
        ),
        ("Injected delays", [fmt(table[s.key]["delays"], ".0f") for s in settings]),
        ("Load average (1 min, at end)", [fmt(table[s.key]["load"], ".1f") for s in settings]),
    ]
    if any(table[s.key]["tau1"] or table[s.key]["tau2"] for s in settings):
        rows.insert(
            2,
            (
                "Timeouts tau1 / tau2 (ms)",
                [
                    f"{1e3 * table[s.key]['tau1']:g} / {1e3 * table[s.key]['tau2']:g}"
                    for s in settings
                ],
            ),
        )
    head = 32
    print(f"\n{title}")
    print(" " * head + "".join(s.label.rjust(width) for s in settings))
    for name, cells in rows:
        print(name.ljust(head) + "".join(c.rjust(width) for c in cells))
    for s in settings:
        for message in table[s.key]["failed"]:
            print(f"  ! {s.label}: {message}")


def plot(
    path: Path, settings: list[Setting], runs: list[RunResult], scenarios: list[tuple[str, str]]
) -> None:
    """Fig. 4: test error against wall time, one line per setting, one panel per scenario.

    Each line is the repeat with the median running time of its cell.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(scenarios), figsize=(6 * len(scenarios), 4.2), sharey=True, squeeze=False
    )
    for ax, (scenario, title) in zip(axes[0], scenarios, strict=True):
        for s in settings:
            cell = sorted(
                (
                    r
                    for r in runs
                    if r.scenario == scenario and r.setting == s.key and r.ok and r.test_time
                ),
                key=lambda r: r.wall_time,
            )
            if not cell:
                continue
            r = cell[(len(cell) - 1) // 2]
            ax.plot(r.test_time, r.test_errors, marker=".", label=s.label)
        ax.set_title(title)
        ax.set_xlabel("wall time (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("top-1 test error")
    axes[0][0].set_yscale("log")
    fig.suptitle("PSP-SGD Fig. 4 on the MLP: test error vs time")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def calibrate(args: argparse.Namespace, runs: list[RunResult]) -> tuple[float, float, str]:
    """Delay and probability from the undelayed Sync runs (module docstring), or the flags."""
    sync = [r for r in runs if r.scenario == "clean" and r.setting == "Sync" and r.ok]
    t = median([r.wall_time for r in sync])
    requests = median([r.minibatches * args.blocks for r in sync])
    delay = args.delay if args.delay is not None else DELAY_SHARE * t
    if args.delay_prob is not None:
        prob = args.delay_prob
    else:
        prob = DELAYS_WORTH * (DELAY_SHARE * t / delay) / requests if requests else 0.0
    why = (
        f"paper: Sync {PAPER_SYNC_DELAYED:.0f} s with delays, ≈{PAPER_SYNC_CLEAN:.0f} s without "
        f"(§4.4: +{PAPER_PROLONG:.0%}); one {PAPER_DELAY:g} s delay = {DELAY_SHARE:.2%} of it, "
        f"total ≈ {DELAYS_WORTH:.1f} delays' worth.\n"
        f"here:  Sync without delays {t:.2f} s, {requests:.0f} pull requests "
        f"(minibatches × {args.blocks} blocks) -> "
        f"delay = {DELAY_SHARE:.4f} × {t:.2f} s = {delay:.3f} s"
        + (" (--delay)" if args.delay is not None else "")
        + f", prob = {DELAYS_WORTH:.1f} / {requests:.0f} = {prob:.5f}"
        + (" (--delay-prob)" if args.delay_prob is not None else "")
        + f" ≈ {prob * requests:.1f} expected delays, ≈ {prob * requests * delay / t:.0%} of "
        "Sync's time if each stalls it"
    )
    return delay, prob, why


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser(
        "Reproduce PSP-SGD Table 1 / Fig. 4 (Sync, partial push, partial push + pull, too "
        "aggressive) on an MLP, without and with injected pull delays.",
        repeats=3, timeout=300.0, quiet_idle=0.0, json_out=False,
    )  # fmt: skip
    add = p.add_argument
    add("--learners", type=int, default=4, help="λ, the number of learners (default: %(default)s)")
    add("--servers", type=int, default=4, help="parameter-server shards (default: %(default)s)")
    add("--blocks", type=int, default=0, help="parameter blocks spread over the shards "
        "(0: 2 per shard) (default: %(default)s)")  # fmt: skip
    add("--epochs", type=int, default=20,
        help="training epochs of every run (default: %(default)s)")  # fmt: skip
    add("--seed", type=int, default=0, help="run.seed of the first repeat (repeat r: seed + r) "
        "(default: %(default)s)")  # fmt: skip
    add("--compute-time", type=float, default=0.02, help="emulated compute seconds per "
        "minibatch (inject.compute_time) (default: %(default)s)")  # fmt: skip
    add("--delay-prob", type=float, default=None, help="share of pull replies delayed "
        "(default: scaled from the paper's 0.16 %%)")  # fmt: skip
    add("--delay", type=float, default=None,
        help="seconds a delayed reply waits (default: scaled from the paper's 4 s)")  # fmt: skip
    add("--tau1", type=float, default=0.0, help="partial-push timeout τ1 (s) of the c < λ "
        "settings (paper: 0) (default: %(default)s)")  # fmt: skip
    add("--epoch-basis", choices=("computed", "applied"), default="computed",
        help="what an epoch counts (run.epoch_basis): computed = passes of the learners over "
        "the data, the paper's notion; applied = gradients that entered updates "
        "(default: %(default)s)")  # fmt: skip
    add("--tau2", type=float, default=0.0, help="partial-pull timeout τ2 (s) of the b < 1 "
        "settings (paper: 0) (default: %(default)s)")  # fmt: skip
    add("--only", choices=("clean", "delayed", "both"), default="both",
        help="scenario(s) to run; delayed alone needs --delay and --delay-prob "
        "(default: %(default)s)")  # fmt: skip
    add("--out", type=Path, default=Path("runs/psp/psp_fig4.png"), help="the plot; the table "
        "goes next to it as .json, the runs under runs/ (default: %(default)s)")  # fmt: skip
    add("--config", type=Path, default=CONFIG, help="base config (default: %(default)s)")
    add("--same-margin", type=float, default=TARGET_ERROR, help="largest difference of mean "
        "final test errors called about the same (default: %(default)s)")  # fmt: skip
    add_data_args(p)
    add("--quick", action="store_true",
        help="smoke test: 3 epochs, 3 learners, 2 shards of 2 blocks each")  # fmt: skip
    return check_args(p, parse(p, argv))


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """--quick applied, the block count chosen, the combinations checked."""
    if args.quick:
        args.epochs, args.learners, args.servers = 3, 3, 2
        args.blocks = args.blocks or 4
        args.compute_time = min(args.compute_time, 0.01)
    args.blocks = args.blocks or 2 * args.servers
    if args.blocks < args.servers:
        p.error(f"--blocks {args.blocks} < --servers {args.servers}: every shard needs a block")
    if args.only == "delayed" and (args.delay is None or args.delay_prob is None):
        p.error("--only delayed needs --delay and --delay-prob (nothing to calibrate from)")
    for name in ("epochs", "learners", "servers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def print_setup(args: argparse.Namespace, settings: list[Setting]) -> None:
    n_ranks = args.servers + 2 + args.learners
    print(
        f"PSP-SGD Table 1 / Fig. 4, MLP on {data_label(args)}: λ = {args.learners} learners, "
        f"{args.servers} shards, {args.blocks} blocks, {args.epochs} epochs, "
        f"compute {1e3 * args.compute_time:g} ms/minibatch, {args.repeats} repeat(s), "
        f"{n_ranks} ranks on {os.cpu_count()} cores"
    )
    print(
        "settings: "
        + ", ".join(f"{s.label} (c={s.c}, b={s.b:g})" for s in settings)
        + f"; tau1 = {args.tau1:g} s, tau2 = {args.tau2:g} s"
    )


def run_all(
    args: argparse.Namespace, settings: list[Setting], started: float
) -> tuple[list[RunResult], float, float]:
    """Every scenario and setting, ``--repeats`` times; the runs, the delay and its probability.

    Repeats are the outer loop, so a spell of load from other work on the machine hits every
    setting of one repeat alike; the savings are then taken within each repeat (paired).
    """
    launcher = Launcher.from_args(__file__, args)
    runs: list[RunResult] = []

    def scenario(name: str, repeat: int, extra: list[str]) -> None:
        for s in settings:
            r = run_one(launcher, args, s, name, repeat, extra)
            runs.append(r)
            state = (
                f"{r.wall_time:6.2f} s  error {r.test_error:.4f}  dropped {r.dropped}"
                f"  stale {r.stale_fraction:.3f}  delays {r.delays}  load {r.load:.1f}"
                if r.ok
                else f"FAILED: {r.message}"
            )
            print(
                f"  [{time.monotonic() - started:5.0f} s] {name:7s} r{repeat} "
                f"{s.label:28s} {state}",
                flush=True,
            )

    delayed: list[str] | None = None
    delay = prob = 0.0
    for repeat in range(args.repeats):
        if args.only in ("clean", "both"):
            scenario("clean", repeat, [])
        if args.only in ("delayed", "both"):
            if delayed is None:  # calibrated once, on repeat 0's undelayed Sync
                delay, prob, why = calibrate(args, runs)
                print(f"with delays, scaled from the paper (§4.2):\n{why}")
                delayed = [f"inject.pull_delay_prob={prob!r}", f"inject.pull_delay={delay!r}"]
            scenario("delayed", repeat, delayed)
    return runs, delay, prob


def verdicts(tables: dict[str, Any], margin: float) -> list[claims.Verdict]:
    """Table 1's two claims, read from the delayed table over the seeds (``scripts/claims.py``).

    * push + pull reaches about the same error as Sync (within ``margin``) in 20–30 % less time
      (the paper: 139.95 s against 199.97 s, -30 %, error 15.65 % against 14.79 %);
    * the too aggressive setting ends at a poorer solution than push + pull (29.14 % against
      15.65 %): its mean final error is higher by more than the seeds' spread (Welch).
    """
    where = "PSP-SGD Table 1"
    fast = "push + pull: about the same error as Sync in >= 20 % less time"
    aggr = "too aggressive partial pushing and pulling ends at a poorer solution"
    if "delayed" not in tables:
        why = "needs the delayed scenario (--only delayed or both)"
        return [claims.not_tested(where, fast, why), claims.not_tested(where, aggr, why)]
    cells = tables["delayed"]

    def sample(key: str, what: str, **kw: Any) -> claims.Sample:
        return claims.Sample.of(cells[key]["label"], cells[key][what], **kw)

    err = {"scale": 100, "unit": "%"}
    sync_t, pp_t = sample("Sync", "times", unit="s"), sample("Sync+push+pull", "times", unit="s")
    sync_e, pp_e = sample("Sync", "errors", **err), sample("Sync+push+pull", "errors", **err)
    return [
        claims.both(
            where,
            fast,
            claims.saving(where, "time", pp_t, sync_t, TARGET_SAVING),
            claims.within(where, "test error", pp_e, sync_e, margin),
        ),  # fmt: skip
        claims.lower(where, aggr, pp_e, sample("aggressive", "errors", **err)),
    ]


def print_verdict(tables: dict[str, Any], margin: float) -> list[claims.Verdict]:
    """The paper's figures, then a verdict per claim."""
    print(
        "\npaper, Table 1 (with delays): "
        + ", ".join(
            f"{k} c={c} b={b:.0%}: {t:.2f} s, error {e:.4f}" for k, (c, b, t, e) in PAPER.items()
        )
    )
    found = verdicts(tables, margin)
    print("\n" + claims.report(found))
    return found


def write_report(
    args: argparse.Namespace,
    settings: list[Setting],
    runs: list[RunResult],
    delay: tuple[float, float],
    tables: dict[str, Any],
    verdict: list[claims.Verdict],
) -> Path:
    """The tables, settings and every run as JSON next to the plot."""
    report = args.out.with_suffix(".json")
    prob, seconds = delay
    doc = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "settings": [asdict(s) for s in settings],
        "delay": {"prob": prob, "seconds": seconds, "delay_share": DELAY_SHARE,
                  "delays_worth": DELAYS_WORTH},
        "tables": tables,
        "claims": [asdict(v) for v in verdict],
        "runs": [{k: v for k, v in asdict(r).items() if k != "minibatch_times"} for r in runs],
    }  # fmt: skip
    report.write_text(json.dumps(doc, indent=1, default=float))
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = paper_settings(args.learners, args.blocks, args.tau1, args.tau2)
    print_setup(args, settings)
    started = time.monotonic()
    runs, delay, prob = run_all(args, settings, started)
    scenarios: list[tuple[str, str]] = []
    if args.only in ("clean", "both"):
        scenarios.append(("clean", "no delay"))
    if args.only in ("delayed", "both"):
        scenarios.append(("delayed", f"with delays (p = {prob:.2g}, {delay:.2f} s)"))
    tables: dict[str, Any] = {}
    for name, title in scenarios:
        tables[name] = summarize(settings, runs, name)
        what = f"{args.repeats} seed(s); rows other than time and error: medians"
        print_table(f"Table 1, {title} ({what}):", settings, tables[name])
    verdict = print_verdict(tables, args.same_margin)
    plot(args.out, settings, runs, scenarios)
    report = write_report(args, settings, runs, (prob, delay), tables, verdict)
    print(
        f"\nplot: {args.out}\ntable: {report}\nruns: {Path(args.out).parent / 'runs'}"
        f"\ntotal {time.monotonic() - started:.0f} s"
    )
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
