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

engines
    Real pserver jobs, one per ``comm.mode`` (blocking, nonblocking, thread): hardsync with two
    learners, learner 1 slowed ``--slow-factor`` times, so learner 0 spends most of the run
    waiting for the next model (in its Waiter, its progress loop or its communication thread)
    and the shard waits for learner 1's gradient. Printed from the dump's ``learners/`` and
    ``servers/`` rows: the share of a core each process used (``cpu_time / run_time``, every
    thread included) and the share of its time learner 0 was blocked. Target: < 10% of a core
    for the waiting learner in every mode.

This file is both the driver (default) and the MPI programs it launches (``--worker``).

Example::

    .venv/bin/python scripts/bench_wait.py --repeats 3 --json /tmp/wait.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (  # (scripts/ is on sys.path)
    RESULT,
    ROOT,
    Launcher,
    bench_parser,
    idle_summary,
    parse,
    pserver_run,
    table,
    write_json,
)
from benchlib import median as med

MODES = ("blocking", "nonblocking", "thread")

MATMUL_N = 192  # matrix order of rank 0's work: a few ms per product on one core
SOLO_SLACK = 0.3  # seconds the sleeping ranks of the solo phase sleep past rank 0's compute


# -- MPI programs (run under mpiexec) -------------------------------------------------------------


POLL: dict[str, float] = {}  # poll_min / poll_max overrides of the [comm] defaults (--poll-*)


def make_waiter() -> Any:
    """A ``Waiter`` exactly as the roles build it: the ``[comm]`` defaults unless overridden."""
    from pserver.comm.waiting import PeerLog, Waiter
    from pserver.plan.config import CommConfig

    c = CommConfig(**POLL)
    log = logging.getLogger("bench_wait")
    return Waiter(log, PeerLog(), c.poll_min, c.poll_max, c.stall_timeout)


def wait_one(comm: Any, kind: str, buf: Any, source: int, waiter: Any) -> None:
    """Receive ``buf`` from ``source``: with the back-off ``waiter`` (built before the timing
    starts: importing pserver's modules is no part of a wait), or a blocking Recv."""
    if kind == "waiter":
        waiter.wait(comm.Irecv(buf, source, 0), "the benchmark message")
    else:
        comm.Recv(buf, source, 0)


def idle_worker(seconds: float) -> None:
    """Rank 1 waits ``seconds`` for rank 0's message, once per wait kind; rank 0 prints."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, buf, out = comm.Get_rank(), np.zeros(1, np.float64), {}
    waiter = make_waiter()
    for kind in ("waiter", "recv"):
        comm.Barrier()
        if rank == 0:
            time.sleep(seconds)
            buf[0] = time.monotonic()  # CLOCK_MONOTONIC: one clock for the whole node
            comm.Send(buf, 1, 0)
            out[kind] = comm.recv(source=1, tag=1)
        elif rank == 1:
            cpu0, t0 = time.process_time(), time.monotonic()
            wait_one(comm, kind, buf, 0, waiter)
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
    waiter = make_waiter()
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
            wait_one(comm, kind, buf, 0, waiter)
            rate, cpu = None, (time.process_time() - cpu0) / (time.monotonic() - t0)
        got = comm.gather((rate, cpu), root=0)
        if rank == 0:
            out[kind] = {"rate": got[0][0], "core_share": [c for _, c in got[1:] if c is not None]}
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)


# -- driver ---------------------------------------------------------------------------------------


def waiter_label() -> str:
    from pserver.plan.config import CommConfig

    c = CommConfig(**POLL)
    return f"Waiter {c.poll_min * 1e6:g}us-{c.poll_max * 1e3:g}ms"


def idle_table(runs: list[dict[str, Any]], seconds: float) -> str:
    title = (
        f"idle wait: rank 1 waits {seconds:g} s for an 8-byte message (2 ranks; medians of "
        f"{len(runs)} run(s))"
    )
    rows = []
    for kind, label in (("waiter", waiter_label()), ("recv", "blocking Recv")):
        cpu = med([r[kind]["cpu_s"] for r in runs])
        share = med([r[kind]["cpu_s"] / r[kind]["wall_s"] for r in runs])
        late = med([r[kind]["late_ms"] for r in runs])
        rows.append([label, f"{cpu:.3f}", f"{share * 100:.1f}%", f"{late:.3f}"])
    return table(["wait", "CPU s", "% core", "woke late ms"], rows, title)


def contend_table(runs: list[dict[str, Any]], ranks: int, seconds: float) -> str:
    cores = os.cpu_count() or 1
    title = (
        f"contention: rank 0 computes {seconds:g} s while {ranks - 1} ranks wait ({ranks} ranks, "
        f"{cores} cores; medians of {len(runs)} run(s))"
    )
    rows = []
    for kind, label in (
        ("solo", "sleep (solo)"),
        ("waiter", waiter_label()),
        ("recv", "blocking Recv"),
    ):
        rate = med([r[kind]["rate"] for r in runs])
        rel = med([r[kind]["rate"] / r["solo"]["rate"] for r in runs])
        share = med([x for r in runs for x in r[kind]["core_share"]])
        share_text = "-" if kind == "solo" else f"{share * 100:.1f}%"
        rows.append([label, f"{rate:.1f}", f"{rel * 100:.0f}%", share_text])
    return table(["the others", "matmul/s", "vs solo", "% core per waiter"], rows, title)


def engine_run(launcher: Launcher, args: argparse.Namespace, mode: str, out: Path) -> dict:
    """One pserver job in ``mode`` with learner 1 slowed; core shares from its dump."""
    import h5py

    quickstart = ROOT / "examples" / "quickstart.toml"
    launcher.run(5, [
        *pserver_run(args), str(quickstart), f"run.out_dir={out}",
        "run.overwrite=true", "stats.progress=false", "run.log_level=warning",
        "protocol.name=hardsync", "run.epochs=1", f"data.batch_size={args.engine_batch}",
        f"comm.mode={mode}", f"inject.compute_time={args.engine_compute}",
        "inject.slow_learner=1", f"inject.learner_factor={args.slow_factor}", *args.set,
    ])  # fmt: skip
    with h5py.File(out / "stats.h5", "r", locking=False) as f:
        lrn, srv = f["learners"], f["servers"]
        mine = {int(i): k for k, i in enumerate(lrn["learner"][:])}
        fast, slow = mine[0], mine[1]
        share = lrn["cpu_time"][:] / lrn["run_time"][:]
        return {
            "waiting_learner_core": float(share[fast]),
            "waiting_learner_blocked": float(
                (lrn["pull_time"][fast] + lrn["push_time"][fast]) / lrn["run_time"][fast]
            ),
            "slow_learner_core": float(share[slow]),
            "server_core": float(srv["cpu_time"][0] / srv["run_time"][0]),
            "run_time": float(lrn["run_time"][fast]),
        }


def engines_table(runs: list[dict[str, dict[str, float]]]) -> str:
    title = (
        f"engines: hardsync, 2 learners, learner 1 slowed; share of a core per process, all "
        f"threads (medians of {len(runs)} run(s))"
    )
    rows = []
    for mode in runs[0]:
        def m(key: str, mode: str = mode) -> float:
            return med([r[mode][key] for r in runs])

        rows.append([
            mode, f"{m('run_time'):.1f}", f"{m('waiting_learner_blocked') * 100:.0f}%",
            f"{m('waiting_learner_core') * 100:.1f}%", f"{m('slow_learner_core') * 100:.1f}%",
            f"{m('server_core') * 100:.1f}%",
        ])  # fmt: skip
    head = ["comm.mode", "run s", "learner 0 blocked", "learner 0 core", "learner 1 core",
            "shard core"]  # fmt: skip
    return table(head, rows, title)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(
        __doc__, repeats=3, timeout=120.0,
        epilog="Target: a rank waiting in pserver's Waiter (or a learner waiting in any "
        "comm.mode) burns < 10% of a core.",
    )  # fmt: skip
    p.add_argument("--idle-seconds", type=float, default=5.0, help="length of the idle wait")
    p.add_argument("--contend-seconds", type=float, default=3.0, help="rank 0's compute time")
    p.add_argument("--ranks", type=int, default=8, help="ranks of the contention experiment")
    p.add_argument(
        "--only", choices=("idle", "contend", "engines"), help="run one experiment, not all three"
    )
    p.add_argument(
        "--slow-factor", type=float, default=25.0, help="engines: learner 1's slow-down (25)"
    )
    p.add_argument(
        "--engine-compute", type=float, default=0.02,
        help="engines: inject.compute_time, s per minibatch before the slow-down (0.02)",
    )  # fmt: skip
    p.add_argument(
        "--engine-batch", type=int, default=64, help="engines: data.batch_size (64: ~11 rounds)"
    )
    p.add_argument("--poll-min", type=float, help="Waiter's first sleep, s ([comm] default)")
    p.add_argument("--poll-max", type=float, help="Waiter's longest sleep, s ([comm] default)")
    p.add_argument("--worker", choices=("idle", "contend"), help=argparse.SUPPRESS)
    args = parse(p, argv)
    if args.ranks < 2:
        p.error("--ranks needs >= 2")
    return args


def measure(args: argparse.Namespace) -> tuple[dict[str, list[Any]], list[float]]:
    """Every experiment asked for, ``--repeats`` times (interleaved); the runs and the idle
    share of the machine before each launch."""
    launcher = Launcher.from_args(__file__, args)
    common = ["--idle-seconds", str(args.idle_seconds)]
    common += ["--contend-seconds", str(args.contend_seconds)]
    common += [f"--{k.replace('_', '-')}={v}" for k, v in POLL.items()]
    runs: dict[str, list[Any]] = {"idle": [], "contend": [], "engines": []}
    with tempfile.TemporaryDirectory(prefix="bench_wait_") as tmp:
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
            if args.only in (None, "idle"):
                runs["idle"].append(launcher.worker(2, ["--worker", "idle", *common]))
            if args.only in (None, "contend"):
                contend = launcher.worker(args.ranks, ["--worker", "contend", *common])
                runs["contend"].append(contend)
            if args.only in (None, "engines"):
                runs["engines"].append(
                    {m: engine_run(launcher, args, m, Path(tmp) / m) for m in MODES}
                )
    return runs, launcher.idle_seen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    POLL.update({k: v for k, v in (("poll_min", args.poll_min), ("poll_max", args.poll_max)) if v})
    if args.worker == "idle":
        idle_worker(args.idle_seconds)
    elif args.worker == "contend":
        contend_worker(args.contend_seconds)
    if args.worker:
        return 0
    runs, seen = measure(args)
    tables = []
    if runs["idle"]:
        tables.append(idle_table(runs["idle"], args.idle_seconds))
    if runs["contend"]:
        tables.append(contend_table(runs["contend"], args.ranks, args.contend_seconds))
    if runs["engines"]:
        tables.append(engines_table(runs["engines"]))
    print("\n\n".join(tables))
    if seen:
        print(f"\n{idle_summary(seen)}")
    write_json(args.json, {"argv": sys.argv, **runs, "idle_before_launches": seen}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
