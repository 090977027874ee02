"""``pserver-run CONFIG.toml [section.key=value ...]``: what every rank runs under mpiexec.

Start-up is two-phase: every rank validates everything (config, rank count, dataset, output
directory) and the ranks agree on the outcome before anyone trains, so bad input ends the job
with one message and exit code 2 on every rank. After that, an exception on any rank aborts the
whole job with a message naming the rank and host: never a hang.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
import traceback

from pserver import __version__
from pserver.config import load_config
from pserver.errors import PserverError
from pserver.logs import setup_logging, wait_until_read


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="pserver-run",
        description="Run one rank of a pserver job; launch every rank with mpiexec -n N.",
        epilog="example: mpiexec -n 7 pserver-run examples/quickstart.toml protocol.name=softsync",
    )
    p.add_argument("config", help="TOML config file (docs/config.md lists every key)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="override a config value; values are TOML (numbers, true, [1, 2], ...)",
    )
    p.add_argument("--version", action="version", version=f"pserver {__version__}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    from pserver.context import local_rank, prepare

    local, nodes = local_rank(world)  # collective: before anything that may fail on one rank
    ctx, error = None, None
    try:
        cfg = load_config(args.config, args.overrides)
        log = setup_logging(rank, "starting", cfg.run.log_level)
        ctx = prepare(cfg, size, rank, log, local, nodes)
    except PserverError as e:
        error = str(e)
    errors = world.allgather(error)  # tiny control data: every rank learns who failed
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        if rank == failed[0][0]:
            where = "" if len(failed) == size else f" (on rank {rank} of {size})"
            print(f"pserver-run: error: {failed[0][1]}{where}", file=sys.stderr, flush=True)
        return 2
    assert ctx is not None
    try:
        run(ctx, world)
    except BaseException:
        print(
            f"pserver-run: rank {rank} ({ctx.layout.describe(rank)}) on {socket.gethostname()} "
            f"failed; aborting the job:\n{traceback.format_exc()}",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        wait_until_read(sys.stdout)
        wait_until_read(sys.stderr)
        world.Abort(1)
        return 1  # not reached: Abort ends every rank
    return 0


def run(ctx, world) -> None:  # noqa: ANN001 - Context and MPI.Comm, imported lazily
    """Build the role's driver and run it to the end of training."""
    from pserver.blas import limit_blas_threads
    from pserver.comm.channels import Channels
    from pserver.topology import Role

    ctx.log = setup_logging(ctx.rank, ctx.layout.describe(ctx.rank), ctx.cfg.run.log_level)
    ctx.channels = Channels.create(world)
    # a thread that waits for the GIL gets it after at most this long (Python's default, 5 ms,
    # left a comm thread 42% of its bandwidth beside pure-Python compute; 0.5 ms: 83%)
    sys.setswitchinterval(ctx.cfg.comm.switch_interval)
    limit_blas_threads(ctx.cfg.run.blas_threads, ctx.log)
    weights = ctx.model.init_params(ctx.cfg.run.seed)  # same seed on every rank: same w0
    if ctx.cfg.comm.transport == "shm":
        from pserver.comm.shm import SharedWindows

        ctx.shm = SharedWindows(
            world, ctx.layout, ctx.blocks, weights.dtype, ctx.nodes, ctx.cfg.comm.versions
        )
    world.Barrier()
    ctx.t0 = time.time()
    role = ctx.role
    if role is Role.SERVER:
        from pserver.roles.server import ServerShard

        ServerShard(ctx, weights).run()
    elif role is Role.LEARNER:
        from pserver.roles.learner import Learner
        from pserver.roles.overlap import OverlapLearner

        (Learner if ctx.cfg.comm.mode == "blocking" else OverlapLearner)(ctx, weights).run()
    elif role is Role.AGGREGATOR:
        from pserver.roles.aggregator import Aggregator

        Aggregator(ctx, weights).run()
    elif role is Role.DATA:
        from pserver.roles.dataserver import DataServer

        DataServer(ctx).run()
    else:
        from pserver.roles.statserver import StatsServer

        StatsServer(ctx).run()
    if ctx.shm is not None:
        ctx.shm.free()
    ctx.channels.free()


if __name__ == "__main__":
    sys.exit(main())
