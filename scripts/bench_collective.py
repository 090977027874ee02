#!/usr/bin/env python3
"""The learners' bucketed non-blocking allreduce against ``MPI_Allreduce(IN_PLACE)``.

Two measurements, each launched under mpiexec with a timeout and repeated (medians printed):

bandwidth
    ``--ranks`` ranks (default 4) sum a float32 buffer of each ``--sizes`` MiB (default 16) in
    place, alternately with a blocking ``MPI_Allreduce(IN_PLACE)`` and with
    :class:`pserver.comm.collectives.Allreducer` (buckets of each ``--bucket-mib`` MiB, default
    16 and 4, up to ``--in-flight`` in flight, waited on with the Waiter's back-off; the sleep
    cap is ``--poll-max``, comm.poll_max's default; each wait first spins for each
    ``--tight-factor`` times the expected time, 0: backs off at once, the rule before),
    ``--reps`` times each in one launch, interleaved, so every variant meets the same machine. A
    time is the slowest rank's, after a barrier. Printed: each one's bandwidth (buffer bytes /
    time) and the ratio bucketed ÷ blocking. Goal: >= 0.9 at 16 MiB on 4 ranks.

cpu
    The same ranks; each kind of allreduce runs once on time (the bucketed one learns its
    expected time), then rank 0 joins the next one ``--delay`` seconds late (it sleeps), so the
    others wait inside it. Each waiting rank reports ``process_time / wall`` over its wait, for
    the bucketed allreduce (the first ``--sizes`` and ``--bucket-mib``, each ``--tight-factor``)
    and for blocking ``MPI_Allreduce`` (which MPICH busy-polls). Goal: the bucketed allreduce
    under 10% of a core.

sync
    One SYNC step's exchange (issue 12, ``pserver.roles.allreduce``): the gradient's bucketed
    allreduce exactly as a SYNC learner runs it (``comm.bucket_mib``, in-flight limit and
    staging of the defaults config), alone and followed by the learner's local update
    (``pserver.optim.local_update``, the defaults' momentum rule), against
    ``MPI_Allreduce(IN_PLACE)``
    on the same buffer, alternately in one launch. Printed: the times and the ratio
    ``MPI_Allreduce / SYNC allreduce`` (1.0: no loss to the bucketing and the back-off).

This file is both the driver (default) and the MPI program it launches (``--worker``).

Example::

    .venv/bin/python scripts/bench_collective.py --repeats 3 --json /tmp/collective.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchlib import (  # (scripts/ is on sys.path)
    RESULT,
    Launcher,
    bench_parser,
    idle_summary,
    median,
    parse,
    table,
    write_json,
)

from pserver.comm.transfer_time import TIGHT_FACTOR  # (benchlib puts the checkout on sys.path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=3, timeout=300.0, pserver_run=False, overrides=False)
    p.add_argument("--ranks", type=int, default=4, help="ranks (default %(default)s)")
    p.add_argument("--sizes", type=float, nargs="+", default=[16.0], metavar="MIB",
                   help="buffer sizes in MiB (default %(default)s)")  # fmt: skip
    p.add_argument("--bucket-mib", type=float, nargs="+", default=[16.0, 4.0], metavar="MIB",
                   help="bucket sizes to try, MiB (default %(default)s)")  # fmt: skip
    p.add_argument("--in-flight", type=int, default=4, help="buckets in flight (default 4)")
    p.add_argument("--reps", type=int, default=10, help="allreduces of each kind per launch")
    p.add_argument("--delay", type=float, default=2.0, help="lateness of rank 0 in the cpu "
                   "measurement, s (default %(default)s)")  # fmt: skip
    p.add_argument("--poll-max", type=float, default=1e-3, help="longest sleep of a wait, s "
                   "(default %(default)s, comm.poll_max's)")  # fmt: skip
    p.add_argument("--tight-factor", type=float, nargs="+", default=[TIGHT_FACTOR],
                   metavar="F", help="spin for F times an allreduce's expected time, then back "
                   "off (default %(default)s; 0: back off at once, the rule before)")  # fmt: skip
    p.add_argument("--skip", choices=["bandwidth", "cpu", "sync"], nargs="*", default=[])
    p.add_argument("--worker", choices=["bandwidth", "cpu", "sync"], help=argparse.SUPPRESS)
    args = parse(p, argv)
    if args.ranks < 2 or args.reps < 1 or args.in_flight < 1 or args.delay <= 0:
        p.error("need --ranks >= 2, --reps >= 1, --in-flight >= 1 and --delay > 0")
    if min(args.tight_factor) < 0:
        p.error("--tight-factor must be >= 0")
    if min(args.sizes) <= 0 or min(args.bucket_mib) <= 0:
        p.error("--sizes and --bucket-mib must be > 0")
    return args


# -- the MPI program ----------------------------------------------------------------------------


def worker_setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from mpi4py import MPI

    from pserver.comm.backend import select_backend
    from pserver.comm.waiting import PeerLog, Waiter

    waiter = Waiter(logging.getLogger("bench"), PeerLog(), poll_max=args.poll_max)
    return MPI, select_backend("cpu", 0, 1), waiter


def timed(comm: Any, MPI: Any, op: Any) -> float:
    """Seconds the slowest rank took for ``op()``, started together after a barrier."""
    comm.Barrier()
    t0 = time.perf_counter()
    op()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def variant(bucket_mib: float, factor: float) -> str:
    return f"{bucket_mib:g} x{factor:g}"


def worker_bandwidth(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from pserver.comm.collectives import Allreducer

    MPI, backend, waiter = worker_setup(args)
    comm = MPI.COMM_WORLD
    out: dict[str, Any] = {}
    for mib in args.sizes:
        x = np.ones(int(mib * 2**20) // 4, np.float32)
        reducers = {
            variant(b, f): Allreducer(comm, backend, waiter, x.size, x.dtype, bucket_mib=b,
                                      in_flight=args.in_flight, tight_factor=f)  # fmt: skip
            for b in args.bucket_mib
            for f in args.tight_factor
        }
        out[f"{mib:g}"] = cell = {"blocking": [], **{k: [] for k in reducers}}
        ops = {"blocking": lambda x=x: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)}
        ops.update({k: lambda r=r, x=x: r.start(x).wait() for k, r in reducers.items()})
        for rep in range(args.reps + 1):  # the first round is a warm-up
            for key, op in ops.items():
                t = timed(comm, MPI, op)
                if rep:
                    cell[key].append(t)
            x.fill(1.0)  # keeps the values finite
    return out


def worker_cpu(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from pserver.comm.collectives import Allreducer

    MPI, backend, waiter = worker_setup(args)
    comm = MPI.COMM_WORLD
    x = np.ones(int(args.sizes[0] * 2**20) // 4, np.float32)
    cases = {
        f"bucketed, tight {f:g}": Allreducer(
            comm, backend, waiter, x.size, x.dtype, bucket_mib=args.bucket_mib[0],
            in_flight=args.in_flight, tight_factor=f,
        ).start
        for f in args.tight_factor
    }  # fmt: skip
    cases["blocking"] = lambda x: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    out: dict[str, Any] = {}
    for name, start in cases.items():
        op = lambda start=start: (h := start(x)) is None or h.wait()  # noqa: E731
        comm.Barrier()
        op()  # on time: what a training loop's previous step would have been
        comm.Barrier()
        if comm.Get_rank() == 0:
            time.sleep(args.delay)  # the late rank: the others wait inside the allreduce
        c0, w0 = time.process_time(), time.perf_counter()
        op()
        share = (time.process_time() - c0) / (time.perf_counter() - w0)
        shares = comm.gather(share, root=0)
        out[name] = shares[1:] if shares else None  # rank 0 did not wait
    return out


def worker_sync(args: argparse.Namespace) -> dict[str, Any]:
    """One SYNC step's allreduce (and update) as ``pserver.roles.allreduce`` runs it."""
    import numpy as np

    from pserver.comm.collectives import DEFAULT_IN_FLIGHT, Allreducer
    from pserver.optim.local_update import LocalUpdate
    from pserver.plan.config import load_config

    MPI, backend, waiter = worker_setup(args)
    comm, cfg = MPI.COMM_WORLD, load_config(None, ['protocol.name="sync"'])
    g = np.ones(int(args.sizes[0] * 2**20) // 4, np.float32)
    w = np.zeros_like(g)
    red = Allreducer(comm, backend, waiter, g.size, g.dtype, bucket_mib=cfg.comm.bucket_mib,
                     in_flight=DEFAULT_IN_FLIGHT, staging=cfg.comm.staging)  # fmt: skip
    update = LocalUpdate(cfg.optim, g.size, np, g.dtype)

    def step() -> None:
        red.start(g).wait()
        update.step(w, g, 0, divisor=float(comm.Get_size()))

    ops = {
        "MPI_Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM),
        "SYNC allreduce": lambda: red.start(g).wait(),
        "SYNC step": step,
    }
    out: dict[str, Any] = {k: [] for k in ops}
    for rep in range(args.reps + 1):  # the first round is a warm-up
        for key, op in ops.items():
            t = timed(comm, MPI, op)
            if rep:
                out[key].append(t)
            g.fill(1.0)
    return out


def worker(args: argparse.Namespace) -> None:
    import json

    from mpi4py import MPI

    run = {"bandwidth": worker_bandwidth, "cpu": worker_cpu, "sync": worker_sync}[args.worker]
    res = run(args)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(RESULT + json.dumps(res), flush=True)


# -- the driver ---------------------------------------------------------------------------------


def flags(args: argparse.Namespace) -> list[str]:
    return [
        "--sizes", *map(str, args.sizes), "--bucket-mib", *map(str, args.bucket_mib),
        "--in-flight", str(args.in_flight), "--poll-max", str(args.poll_max),
        "--reps", str(args.reps), "--delay", str(args.delay),
        "--tight-factor", *map(str, args.tight_factor),
    ]  # fmt: skip


def bandwidth(launcher: Launcher, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    runs = [launcher.worker(args.ranks, ["--worker", "bandwidth", *flags(args)])
            for _ in range(args.repeats)]  # fmt: skip
    rows, doc = [], {}
    for mib in args.sizes:
        key = f"{mib:g}"
        t_block = median(t for r in runs for t in r[key]["blocking"])
        gbs = mib * 2**20 / 1e9
        for b in args.bucket_mib:
            for f in args.tight_factor:
                t = median(t for r in runs for t in r[key][variant(b, f)])
                doc[f"{key} MiB / {b:g} MiB buckets / tight {f:g}"] = {
                    "blocking_s": t_block, "bucketed_s": t}  # fmt: skip
                rows.append([key, f"{b:g}", f"{f:g}", f"{gbs / t_block:.2f}", f"{gbs / t:.2f}",
                             f"{t_block / t:.2f}"])  # fmt: skip
    title = (f"bandwidth on {args.ranks} ranks, {args.in_flight} bucket(s) in flight, poll_max "
             f"{args.poll_max:g}, median of {args.reps} x {args.repeats}")  # fmt: skip
    head = ["MiB", "bucket MiB", "tight", "Allreduce GB/s", "bucketed GB/s",
            "bucketed / Allreduce"]  # fmt: skip
    return table(head, rows, title), doc


def cpu(launcher: Launcher, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    runs = [launcher.worker(args.ranks, ["--worker", "cpu", *flags(args)])
            for _ in range(args.repeats)]  # fmt: skip
    doc = {k: median(s for r in runs for s in r[k]) for k in runs[0]}
    rows = [[k, f"{v:.1%}"] for k, v in doc.items()]
    title = (f"CPU of a rank waiting {args.delay:g} s in a {args.sizes[0]:g} MiB allreduce "
             f"({args.ranks} ranks, rank 0 late), median over ranks and repeats")  # fmt: skip
    return table(["allreduce", "process_time / wall"], rows, title), doc


def sync(launcher: Launcher, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    runs = [launcher.worker(args.ranks, ["--worker", "sync", *flags(args)])
            for _ in range(args.repeats)]  # fmt: skip
    doc = {k: median(t for r in runs for t in r[k]) for k in runs[0]}
    base = doc["MPI_Allreduce"]
    rows = [[k, f"{1e3 * v:.2f}", f"{base / v:.2f}"] for k, v in doc.items()]
    title = (f"one SYNC step's exchange, {args.sizes[0]:g} MiB float32 on {args.ranks} ranks, "
             f"median of {args.reps} x {args.repeats}")  # fmt: skip
    return table(["operation", "ms", "MPI_Allreduce / this"], rows, title), doc


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    launcher = Launcher.from_args(__file__, args)
    doc: dict[str, Any] = {"ranks": args.ranks, "in_flight": args.in_flight}
    doc.update(poll_max=args.poll_max, tight_factor=args.tight_factor)
    for name, measure in (("bandwidth", bandwidth), ("cpu", cpu), ("sync", sync)):
        if name not in args.skip:
            text, doc[name] = measure(launcher, args)
            print(text, "\n", flush=True)
    print(idle_summary(launcher.idle_seen))
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
