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
    ``hardsync`` with learner 0 slowed ``--slow-factor`` times (default 100: its minibatch takes
    ``compute_time`` × 100 = 1 s): every other rank has nothing to do for almost the whole
    round. The other learners wait for the update, the shard for learner 0's gradient, the data
    and statistics servers between requests. An idle rank's cost is its CPU time (every thread:
    ``/proc/PID/task/*/schedstat``, sampled every ``SAMPLE_PERIOD`` s while the job runs) over
    the wall time of the stretch from one round after the last rank passed the start barrier
    to one round before the first rank ended training (the ranks' ``phase`` DEBUG lines): its
    share of a core (issue 26: < 1 % at any λ). The waiting learners' share still holds their
    own step per round (a 16-sample minibatch, a push and a pull: ~1 ms of CPU per 1 s round,
    0.1 %). Printed per role: the median and the largest share among the idle learners, the
    shard, the data server, the statistics server; and, from the dump, the learners'
    ``cpu_time / run_time`` over the whole run (start and end of training included).

``--quick``: λ = 4, 8, 16, one run each; the default λ = 4, 8, 16, 32; ``--full`` adds 64 and
128. Run from the checkout (its code is what the ranks run)::

    .venv/bin/python scripts/bench_scaling.py --quick
    .venv/bin/python scripts/bench_scaling.py --full --repeats 3
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import ROOT, Launcher, bench_parser, idle_summary, parse, table, write_json
from benchlib import median as med

from pserver.job import launch

QUICK, DEFAULT, FULL = (4, 8, 16), (4, 8, 16, 32), (4, 8, 16, 32, 64, 128)
OTHER_RANKS = 3  # shard, statistics server, data server
IDLE_ROUNDS = 12  # hardsync rounds of the idle experiment (each one slowed learner's step)
TRAIN_SAMPLES = 1347  # the quickstart's digits training set (75 % of 1,797)
SAMPLE_PERIOD = 0.5  # seconds between two reads of the ranks' CPU time (idle)
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")  # a rank's number, MPICH's or Open MPI's
PHASE_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) \[rank (\d+) [^]]*\] DEBUG phase "
                        r"(start barrier|training):", re.M)  # fmt: skip


def options(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=1, timeout=300.0, quiet_idle=0.0)
    p.set_defaults(pserver_run=shlex.join(launch.pserver_cli()))
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"λ = {QUICK}")
    size.add_argument("--full", action="store_true", help=f"λ = {FULL}")
    size.add_argument("--lambdas", type=int, nargs="+", help=f"λ values (default {DEFAULT})")
    p.add_argument("--epochs", type=int, default=0, help="throughput epochs (0: 2 quick, else 5)")
    p.add_argument("--compute-time", type=float, default=0.01, help="inject.compute_time, s")
    p.add_argument("--slow-factor", type=float, default=100.0,
                   help="idle: learner 0's slow-down (its step: compute-time × this)")
    p.add_argument("--only", choices=("throughput", "idle"), help="one experiment only")
    p.add_argument("--threads", action="store_true",
                   help="throughput: also sample each learner's threads from /proc (main "
                        "thread's share of its CPU over the training)")  # fmt: skip
    p.add_argument(
        "--baseline", type=Path, metavar="DIR",
        help="also run every job with the code of this checkout (e.g. the commit before a "
        "change, from `git archive`), alternating with this one: before and after, same load",
    )  # fmt: skip
    args = parse(p, argv)
    args.lambdas = args.lambdas or (QUICK if args.quick else FULL if args.full else DEFAULT)
    args.epochs = args.epochs or (2 if args.quick else 5)
    return args


class CpuSampler:
    """Reads, every ``SAMPLE_PERIOD`` s in a thread, the CPU time of every rank of one job
    (the processes whose command line holds ``marker``; their rank from the launcher's
    variables): all threads' nanoseconds on a CPU (``/proc/PID/task/*/schedstat``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        # (time.time(), {rank: (ns of the main thread, ns of its other threads)})
        self.samples: list[tuple[float, dict[int, tuple[int, int]]]] = []
        self.ranks: dict[int, int] = {}  # pid -> rank
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def loop(self) -> None:
        while not self.stop.wait(SAMPLE_PERIOD):
            self.find()
            now, got = time.time(), {}
            for pid, rank in self.ranks.items():
                ns = cpu_ns(pid)
                if ns is not None:
                    got[rank] = ns
            self.samples.append((now, got))

    def find(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in self.ranks:
                continue
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes()
                if self.marker.encode() not in cmd or b"pserver" not in cmd:
                    continue
                env = dict(
                    kv.split(b"=", 1) for kv in Path(f"/proc/{name}/environ").read_bytes()
                    .split(b"\0") if b"=" in kv
                )  # fmt: skip
            except OSError:  # ended meanwhile, or not ours to read
                continue
            rank = next((env[v.encode()] for v in RANK_VARS if v.encode() in env), None)
            if rank is not None:
                self.ranks[int(name)] = int(rank)

    def shares(self, start: float, end: float, part: int | None = None) -> dict[int, float]:
        """Each rank's share of a core between the first sample at or after ``start`` and the
        last at or before ``end`` (empty when fewer than two samples lie between); ``part``
        0: its main thread only, 1: its other threads only (prefetcher, comm thread)."""
        inside = [(t, got) for t, got in self.samples if start <= t <= end]
        if len(inside) < 2:
            return {}
        (t0, a), (t1, b) = inside[0], inside[-1]

        def ns(x: tuple[int, int]) -> int:
            return sum(x) if part is None else x[part]

        return {r: (ns(b[r]) - ns(a[r])) / 1e9 / (t1 - t0) for r in a if r in b}


def cpu_ns(pid: int) -> tuple[int, int] | None:
    """Nanoseconds process ``pid`` has run on a CPU: (its main thread, its other threads);
    None once it ended."""
    main = other = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                ns = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):  # a thread that just ended
                continue
            if int(task) == pid:
                main += ns
            else:
                other += ns
    except OSError:
        return None
    return main, other


def training_span(stderr: str) -> tuple[float, float]:
    """(when the last rank passed the start barrier, when the first ended training), on
    ``time.time()``'s clock, from the ranks' DEBUG phase lines (stamped local time of day)."""
    day = time.mktime((*time.localtime()[:3], 0, 0, 0, 0, 0, -1))  # today's midnight
    starts, ends = [], []
    for m in PHASE_LINE.finditer(stderr):
        t = day + int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
        (starts if m[5] == "start barrier" else ends).append(t)
    if not starts or not ends:
        raise RuntimeError("no phase lines in the job's output: run.log_level=debug missing?")
    return max(starts), min(ends)


def job(
    launcher: Launcher, args: argparse.Namespace, lam: int, sets: list[str], margin: float = -1
) -> Any:
    """One quickstart job with ``lam`` learners; its dump's summary. With ``margin`` ≥ 0 the
    ranks' CPU is sampled too: ``idle_shares`` holds each rank's share of a core over the
    training less ``margin`` s at each end (:class:`CpuSampler`)."""
    from pserver.dump.reader import load_dump, summarize

    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        cmd = [*shlex.split(args.pserver_run), str(ROOT / "examples/quickstart.toml"),
               f"cluster.learners={lam}", f"run.out_dir={tmp}/run", "run.overwrite=true",
               "stats.progress=false", *sets, *args.set]  # fmt: skip
        if margin < 0:
            launcher.run(lam + OTHER_RANKS, cmd)
            idle_shares: dict[int, float] = {}
            main_shares: dict[int, float] = {}
        else:
            with CpuSampler(f"run.out_dir={tmp}/run") as sampler:
                res = launcher.run(lam + OTHER_RANKS, [*cmd, "run.log_level=debug"])
            start, end = training_span(res.stderr)
            idle_shares = sampler.shares(start + margin, end - margin)
            main_shares = sampler.shares(start + margin, end - margin, part=0)
        dump = load_dump(Path(tmp) / "run" / "stats.h5")
        out = summarize(dump)
        rows = dump.group("servers")
        out["server_share"] = (
            float(rows["cpu_time"][0] / rows["run_time"][0]) if dump.rows("servers") else math.nan
        )
        out["idle_shares"], out["main_shares"] = idle_shares, main_shares
        return out


def shares(summary: dict[str, Any], skip: int | None = None) -> list[float]:
    return [r["cpu_time"] / r["run_time"] for i, r in summary["learners"].items() if i != skip]


def throughput(launcher: Launcher, args: argparse.Namespace, lam: int) -> dict[str, float]:
    s = job(launcher, args, lam, ["protocol.name=async", f"run.epochs={args.epochs}",
                                  f"inject.compute_time={args.compute_time}"],
            margin=0.0 if args.threads else -1)  # fmt: skip
    steps = [r["cpu_time"] / r["minibatches"] for r in s["learners"].values() if r["minibatches"]]
    out = {"samples_per_s": s["samples_per_s"], "learner_core": med(shares(s)),
           "server_core": s["server_share"], "cpu_ms_per_step": med(steps) * 1e3}  # fmt: skip
    if args.threads:  # each learner's main thread and its others (prefetcher, comm thread)
        every = [v for r, v in s["idle_shares"].items() if r >= OTHER_RANKS]
        main = [v for r, v in s["main_shares"].items() if r >= OTHER_RANKS]
        out["main_share"] = med(main) / med(every) if every and med(every) else math.nan
    return out


def idle(launcher: Launcher, args: argparse.Namespace, lam: int) -> dict[str, float]:
    # enough epochs for IDLE_ROUNDS rounds of λ minibatches (16 samples each)
    epochs = max(1, math.ceil(IDLE_ROUNDS * lam * 16 / TRAIN_SAMPLES))
    round_s = args.compute_time * args.slow_factor  # learner 0's step: the others' idle stretch
    s = job(launcher, args, lam, [
        "protocol.name=hardsync", f"run.epochs={epochs}", "stats.test_every=1",
        f"inject.compute_time={args.compute_time}", "inject.slow_learner=0",
        f"inject.learner_factor={args.slow_factor}",
    ], margin=round_s)  # fmt: skip
    waits = [r["wait_time"] / r["run_time"] for i, r in s["learners"].items() if i != 0]
    got = s["idle_shares"]
    # the quickstart's layout: rank 0 the shard, 1 the statistics server, 2 the data server,
    # 3 learner 0 (the slow one), then the idle learners
    learners = [v for r, v in got.items() if r > OTHER_RANKS]
    nan = math.nan
    return {"idle_core": med(learners) if learners else nan,
            "max_idle_core": max(learners) if learners else nan,
            "shard_idle": got.get(0, nan), "stats_idle": got.get(1, nan),
            "data_idle": got.get(2, nan), "run_core": med(shares(s, skip=0)),
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
                 f"{med(r['server_core'] for r in got) * 100:.1f}%",
                 f"{med(r['cpu_ms_per_step'] for r in got):.2f}",
                 f"{med((r.get('main_share', math.nan) for r in got), drop_nan=True):.2f}"]
                for lam, got in tp.items()]  # fmt: skip
        out.append(table(
            ["λ", "samples/s", "÷ λ=4", "÷ λ=32", "learner % core", "shard % core",
             "learner CPU ms/minibatch", "main thread's share (--threads)"], rows,
            f"throughput: async, inject.compute_time={args.compute_time}, {args.epochs} epochs "
            f"(medians of {args.repeats})",
        ))  # fmt: skip
    if idl:
        def pct(got: list[dict[str, float]], key: str) -> str:
            return f"{med((r[key] for r in got), drop_nan=True) * 100:.2f}%"

        rows = [[str(lam), pct(got, "idle_core"), pct(got, "max_idle_core"),
                 pct(got, "shard_idle"), pct(got, "data_idle"), pct(got, "stats_idle"),
                 pct(got, "run_core"), f"{med(r['waiting'] for r in got) * 100:.0f}%"]
                for lam, got in idl.items()]  # fmt: skip
        out.append(table(
            ["λ", "idle learner % core (median)", "(max)", "shard", "data server",
             "stats server", "learner, whole run (dump)", "time waiting"],
            rows, f"idle: hardsync, learner 0's step {args.compute_time * args.slow_factor:g} s; "
            "each rank's CPU over the training less a round at each end (target < 1 % of a "
            "core)",
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
