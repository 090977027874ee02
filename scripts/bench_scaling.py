#!/usr/bin/env python3
"""Learners on one node: samples/s as λ grows, and what an idle rank costs.

Two experiments per λ (quickstart model and data, 1 shard + stats + data server + λ learners,
every rank on this machine's cores), each read back from the run's dump:

throughput
    ``async`` with ``inject.compute_time`` (default 0.01 s, a sleeping "GPU") for ``--epochs``
    epochs: samples/s (the dump's samples ÷ its wall time), each learner's and the shard's share
    of a core (``cpu_time / run_time``). Printed with the ratio to λ = 4 and to λ = 32 (when
    run), measured in the same run (issue 26: λ = 64 ≥ 0.8 and λ = 128 ≥ 0.6 of λ = 32).

idle
    ``hardsync`` with learner 0 slowed ``--slow-factor`` times: every other learner waits for
    the update almost all the run, in its Waiter. Printed: their median share of a core (the
    cost of an idle rank; issue 26: < 1 %) and the waiting share of their time.

``--quick``: λ = 4, 8, 16, one run each; the default λ = 4, 8, 16, 32; ``--full`` adds 64 and
128. Run from the checkout (its code is what the ranks run)::

    .venv/bin/python scripts/bench_scaling.py --quick
    .venv/bin/python scripts/bench_scaling.py --full --repeats 3
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import ROOT, Launcher, bench_parser, idle_summary, parse, table, write_json
from benchlib import median as med

from pserver.job import launch

QUICK, DEFAULT, FULL = (4, 8, 16), (4, 8, 16, 32), (4, 8, 16, 32, 64, 128)
OTHER_RANKS = 3  # shard, statistics server, data server
IDLE_ROUNDS = 12  # hardsync rounds of the idle experiment (each one slowed learner's step)
TRAIN_SAMPLES = 1347  # the quickstart's digits training set (75 % of 1,797)


def options(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=1, timeout=300.0, quiet_idle=0.0)
    p.set_defaults(pserver_run=shlex.join(launch.pserver_cli()))
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"λ = {QUICK}")
    size.add_argument("--full", action="store_true", help=f"λ = {FULL}")
    size.add_argument("--lambdas", type=int, nargs="+", help=f"λ values (default {DEFAULT})")
    p.add_argument("--epochs", type=int, default=0, help="throughput epochs (0: 2 quick, else 5)")
    p.add_argument("--compute-time", type=float, default=0.01, help="inject.compute_time, s")
    p.add_argument("--slow-factor", type=float, default=20.0, help="idle: learner 0's slow-down")
    p.add_argument("--only", choices=("throughput", "idle"), help="one experiment only")
    p.add_argument(
        "--baseline", type=Path, metavar="DIR",
        help="also run every job with the code of this checkout (e.g. the commit before a "
        "change, from `git archive`), alternating with this one: before and after, same load",
    )  # fmt: skip
    args = parse(p, argv)
    args.lambdas = args.lambdas or (QUICK if args.quick else FULL if args.full else DEFAULT)
    args.epochs = args.epochs or (2 if args.quick else 5)
    return args


def job(launcher: Launcher, args: argparse.Namespace, lam: int, sets: list[str]) -> Any:
    """One quickstart job with ``lam`` learners; its dump's summary."""
    from pserver.dump.reader import load_dump, summarize

    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        cmd = [*shlex.split(args.pserver_run), str(ROOT / "examples/quickstart.toml"),
               f"cluster.learners={lam}", f"run.out_dir={tmp}/run", "run.overwrite=true",
               "stats.progress=false", *sets, *args.set]  # fmt: skip
        launcher.run(lam + OTHER_RANKS, cmd)
        dump = load_dump(Path(tmp) / "run" / "stats.h5")
        out = summarize(dump)
        rows = dump.group("servers")
        out["server_share"] = (
            float(rows["cpu_time"][0] / rows["run_time"][0]) if dump.rows("servers") else math.nan
        )
        return out


def shares(summary: dict[str, Any], skip: int | None = None) -> list[float]:
    return [r["cpu_time"] / r["run_time"] for i, r in summary["learners"].items() if i != skip]


def throughput(launcher: Launcher, args: argparse.Namespace, lam: int) -> dict[str, float]:
    s = job(launcher, args, lam, ["protocol.name=async", f"run.epochs={args.epochs}",
                                  f"inject.compute_time={args.compute_time}"])  # fmt: skip
    return {"samples_per_s": s["samples_per_s"], "learner_core": med(shares(s)),
            "server_core": s["server_share"]}  # fmt: skip


def idle(launcher: Launcher, args: argparse.Namespace, lam: int) -> dict[str, float]:
    # enough epochs for IDLE_ROUNDS rounds of λ minibatches (16 samples each)
    epochs = max(1, math.ceil(IDLE_ROUNDS * lam * 16 / TRAIN_SAMPLES))
    s = job(launcher, args, lam, [
        "protocol.name=hardsync", f"run.epochs={epochs}", "stats.test_every=1",
        f"inject.compute_time={args.compute_time}", "inject.slow_learner=0",
        f"inject.learner_factor={args.slow_factor}",
    ])  # fmt: skip
    waits = [r["wait_time"] / r["run_time"] for i, r in s["learners"].items() if i != 0]
    return {"idle_core": med(shares(s, skip=0)), "max_idle_core": max(shares(s, skip=0)),
            "waiting": med(waits), "server_core": s["server_share"]}  # fmt: skip


def ratio(runs: dict[int, list[dict[str, float]]], lam: int, base: int, key: str) -> str:
    if base not in runs or not runs[base]:
        return "-"
    return f"{med(r[key] for r in runs[lam]) / med(r[key] for r in runs[base]):.2f}"


def report(args: argparse.Namespace, tp: dict, idl: dict) -> str:
    out = []
    if tp:
        rows = [[str(lam), f"{med(r['samples_per_s'] for r in got):.0f}",
                 ratio(tp, lam, 4, "samples_per_s"), ratio(tp, lam, 32, "samples_per_s"),
                 f"{med(r['learner_core'] for r in got) * 100:.1f}%",
                 f"{med(r['server_core'] for r in got) * 100:.1f}%"]
                for lam, got in tp.items()]  # fmt: skip
        out.append(table(
            ["λ", "samples/s", "÷ λ=4", "÷ λ=32", "learner % core", "shard % core"], rows,
            f"throughput: async, inject.compute_time={args.compute_time}, {args.epochs} epochs "
            f"(medians of {args.repeats})",
        ))  # fmt: skip
    if idl:
        rows = [[str(lam), f"{med(r['idle_core'] for r in got) * 100:.2f}%",
                 f"{med(r['max_idle_core'] for r in got) * 100:.2f}%",
                 f"{med(r['waiting'] for r in got) * 100:.0f}%",
                 f"{med(r['server_core'] for r in got) * 100:.1f}%"]
                for lam, got in idl.items()]  # fmt: skip
        out.append(table(
            ["λ", "idle learner % core (median)", "(max)", "time waiting", "shard % core"],
            rows, f"idle: hardsync, learner 0 slowed {args.slow_factor:g}x; the others wait "
            "(target < 1 % of a core)",
        ))  # fmt: skip
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    trees = {"this checkout": ROOT}
    if args.baseline is not None:
        trees = {f"baseline {args.baseline}": args.baseline.resolve(), **trees}
    launchers = {k: Launcher.from_args(__file__, args, cwd=d) for k, d in trees.items()}
    tp: dict[str, dict[int, list[dict[str, float]]]] = {k: {} for k in trees}
    idl: dict[str, dict[int, list[dict[str, float]]]] = {k: {} for k in trees}
    for i in range(args.repeats):
        for lam in args.lambdas:
            for name, launcher in launchers.items():  # alternated: the same load for both
                print(f"repeat {i + 1}/{args.repeats}, λ = {lam}, {name}", file=sys.stderr,
                      flush=True)  # fmt: skip
                if args.only != "idle":
                    tp[name].setdefault(lam, []).append(throughput(launcher, args, lam))
                if args.only != "throughput":
                    idl[name].setdefault(lam, []).append(idle(launcher, args, lam))
    for name in trees:
        print(f"== {name}\n{report(args, tp[name], idl[name])}\n")
    print(idle_summary([x for launcher in launchers.values() for x in launcher.idle_seen]))
    write_json(args.json, {"throughput": tp, "idle": idl})
    return 0


if __name__ == "__main__":
    sys.exit(main())
