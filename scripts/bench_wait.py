#!/usr/bin/env python3
"""CPU burnt by a rank that waits for a message: pserver's back-off ``Waiter`` vs blocking Recv.

Two experiments, each launched under mpiexec with a timeout and repeated (medians reported):

idle
    2 ranks. Rank 0 sleeps ``--idle-seconds`` (default 5) and then sends 8 bytes; rank 1 waits
    for them, once with ``pserver.comm.waiting.Waiter.wait`` on an ``Irecv`` (the code every
    pserver role uses for every wait, with the defaults of ``[comm]``) and once with a blocking
    ``Recv`` (MPICH busy-polls). Rank 1 reports its own ``time.process_time()`` over the wait
    as a share of a core, and how late it woke up after the send (the price of the back-off).
    Target: the Waiter under 10% of a core.

contend
    ``--ranks`` ranks (default 8) on this machine's cores. Rank 0 runs numpy matrix products
    (one BLAS thread) for ``--contend-seconds`` (default 3) while the other ranks wait for a
    message it sends at the end: first with the others asleep (``time.sleep``, the solo
    baseline), then with them waiting in ``Waiter.wait``, then in blocking ``Recv``. Printed:
    rank 0's throughput relative to solo, and the share of a core each waiting rank burns.

This file is both the driver (default) and the MPI programs it launches (``--worker``).

Example::

    .venv/bin/python scripts/bench_wait.py --repeats 3 --json /tmp/wait.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import RESULT, Launcher, add_launch_args  # noqa: E402  (scripts/ on sys.path)

MATMUL_N = 192  # matrix order of rank 0's work: a few ms per product on one core
SOLO_SLACK = 0.3  # seconds the sleeping ranks of the solo phase sleep past rank 0's compute


# -- MPI programs (run under mpiexec) -------------------------------------------------------------


POLL: dict[str, float] = {}  # poll_min / poll_max overrides of the [comm] defaults (--poll-*)


def make_waiter() -> Any:
    """A ``Waiter`` exactly as the roles build it: the ``[comm]`` defaults unless overridden."""
    from pserver.comm.waiting import PeerLog, Waiter
    from pserver.config import CommConfig

    c = CommConfig(**POLL)
    log = logging.getLogger("bench_wait")
    return Waiter(log, PeerLog(), c.poll_min, c.poll_max, c.stall_timeout)


def wait_one(comm: Any, kind: str, buf: Any, source: int) -> None:
    """Receive ``buf`` from ``source``: with the back-off Waiter, a blocking Recv, or asleep."""
    if kind == "waiter":
        make_waiter().wait(comm.Irecv(buf, source, 0), "the benchmark message")
    else:
        comm.Recv(buf, source, 0)


def idle_worker(seconds: float) -> None:
    """Rank 1 waits ``seconds`` for rank 0's message, once per wait kind; rank 0 prints."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, buf, out = comm.Get_rank(), np.zeros(1, np.float64), {}
    for kind in ("waiter", "recv"):
        comm.Barrier()
        if rank == 0:
            time.sleep(seconds)
            buf[0] = time.monotonic()  # CLOCK_MONOTONIC: one clock for the whole node
            comm.Send(buf, 1, 0)
            out[kind] = comm.recv(source=1, tag=1)
        elif rank == 1:
            cpu0, t0 = time.process_time(), time.monotonic()
            wait_one(comm, kind, buf, 0)
            cpu, t1 = time.process_time() - cpu0, time.monotonic()
            res = {"cpu_s": cpu, "wall_s": t1 - t0, "late_ms": (t1 - buf[0]) * 1e3}
            comm.send(res, dest=0, tag=1)
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)


def matmuls_for(seconds: float) -> float:
    """Matrix products per second that this rank manages in ``seconds`` of trying."""
    import numpy as np

    a = np.random.default_rng(0).random((MATMUL_N, MATMUL_N))
    c = np.empty_like(a)
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        np.matmul(a, a, out=c)
        n += 1
    return n / elapsed


def contend_worker(seconds: float) -> None:
    """Rank 0 computes while the others sleep / back off / busy-poll; rank 0 prints."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size, buf, out = comm.Get_rank(), comm.Get_size(), np.zeros(1), {}
    for kind in ("solo", "waiter", "recv"):
        comm.Barrier()
        if rank == 0:
            rate = matmuls_for(seconds)
            if kind != "solo":
                for r in range(1, size):
                    comm.Send(buf, r, 0)
            cpu = None
        elif kind == "solo":
            time.sleep(seconds + SOLO_SLACK)
            rate = cpu = None
        else:
            cpu0, t0 = time.process_time(), time.monotonic()
            wait_one(comm, kind, buf, 0)
            rate, cpu = None, (time.process_time() - cpu0) / (time.monotonic() - t0)
        got = comm.gather((rate, cpu), root=0)
        if rank == 0:
            out[kind] = {"rate": got[0][0], "core_share": [c for _, c in got[1:] if c is not None]}
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)


# -- driver ---------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def waiter_label() -> str:
    from pserver.config import CommConfig

    c = CommConfig(**POLL)
    return f"Waiter {c.poll_min * 1e6:g}us-{c.poll_max * 1e3:g}ms"


def idle_table(runs: list[dict[str, Any]], seconds: float) -> str:
    lines = [
        f"idle wait: rank 1 waits {seconds:g} s for an 8-byte message (2 ranks; medians of "
        f"{len(runs)} run(s))",
        f"{'wait':<24} {'CPU s':>7} {'% core':>7} {'woke late ms':>13}",
    ]
    for kind, label in (("waiter", waiter_label()), ("recv", "blocking Recv")):
        cpu = med([r[kind]["cpu_s"] for r in runs])
        share = med([r[kind]["cpu_s"] / r[kind]["wall_s"] for r in runs])
        late = med([r[kind]["late_ms"] for r in runs])
        lines.append(f"{label:<24} {cpu:>7.3f} {share * 100:>6.1f}% {late:>13.3f}")
    return "\n".join(lines)


def contend_table(runs: list[dict[str, Any]], ranks: int, seconds: float) -> str:
    cores = os.cpu_count() or 1
    lines = [
        f"contention: rank 0 computes {seconds:g} s while {ranks - 1} ranks wait ({ranks} ranks, "
        f"{cores} cores; medians of {len(runs)} run(s))",
        f"{'the others':<24} {'matmul/s':>9} {'vs solo':>8} {'% core per waiter':>18}",
    ]
    for kind, label in (
        ("solo", "sleep (solo)"),
        ("waiter", waiter_label()),
        ("recv", "blocking Recv"),
    ):
        rate = med([r[kind]["rate"] for r in runs])
        rel = med([r[kind]["rate"] / r["solo"]["rate"] for r in runs])
        share = med([x for r in runs for x in r[kind]["core_share"]])
        share_text = "-" if kind == "solo" else f"{share * 100:.1f}%"
        lines.append(f"{label:<24} {rate:>9.1f} {rel * 100:>7.0f}% {share_text:>18}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Target: a rank waiting in pserver's Waiter burns < 10%% of a core.",
    )
    p.add_argument("--idle-seconds", type=float, default=5.0, help="length of the idle wait")
    p.add_argument("--contend-seconds", type=float, default=3.0, help="rank 0's compute time")
    p.add_argument("--ranks", type=int, default=8, help="ranks of the contention experiment")
    p.add_argument("--repeats", type=int, default=3, help="runs of each experiment (medians)")
    p.add_argument("--only", choices=("idle", "contend"), help="run one experiment instead of both")
    add_launch_args(p, timeout=120.0)
    p.add_argument("--json", type=Path, help="also write every run's figures as JSON")
    p.add_argument("--poll-min", type=float, help="Waiter's first sleep, s ([comm] default)")
    p.add_argument("--poll-max", type=float, help="Waiter's longest sleep, s ([comm] default)")
    p.add_argument("--worker", choices=("idle", "contend"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks < 2 or args.repeats < 1:
        p.error("--ranks needs >= 2 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    POLL.update({k: v for k, v in (("poll_min", args.poll_min), ("poll_max", args.poll_max)) if v})
    if args.worker == "idle":
        idle_worker(args.idle_seconds)
        return 0
    if args.worker == "contend":
        contend_worker(args.contend_seconds)
        return 0
    launcher = Launcher(
        __file__, args.mpiexec, args.timeout, args.verbose, args.quiet_idle, args.quiet_wait
    )
    common = ["--idle-seconds", str(args.idle_seconds)]
    common += ["--contend-seconds", str(args.contend_seconds)]
    common += [f"--{k.replace('_', '-')}={v}" for k, v in POLL.items()]
    idle: list[dict[str, Any]] = []
    contend: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        print(f"repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
        if args.only in (None, "idle"):
            idle.append(launcher.worker(2, ["--worker", "idle", *common]))
        if args.only in (None, "contend"):
            contend.append(launcher.worker(args.ranks, ["--worker", "contend", *common]))
    if idle:
        print(idle_table(idle, args.idle_seconds))
    if contend:
        print(("\n" if idle else "") + contend_table(contend, args.ranks, args.contend_seconds))
    seen = launcher.idle_seen
    if seen:
        print(f"\nCPU idle before launches: min {min(seen):.0%}, median {med(seen):.0%}")
    if args.json:
        doc = {"argv": sys.argv, "idle": idle, "contend": contend, "idle_before_launches": seen}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
