"""``pserver-run CONFIG.toml [section.key=value ...]``: what every rank runs under mpiexec.

``--resume RUN_DIR`` (CONFIG optional) continues a checkpointed run (``pserver.job.resume_dir``);
``--list``, ``--print-config`` and ``--dry-run`` are answered in one process before MPI starts
(``pserver.job.console``), so this module imports ``mpi4py.MPI`` only inside :func:`main`.

Start-up is two-phase: every rank validates everything (config, rank count, dataset, output
directory, memory) and the ranks agree on the outcome before anyone trains (``startup.agree``),
so bad input ends the job with one message and exit code 2 on every rank, and any other failure
while preparing with one message naming the rank and exit code 1. After that, an exception on
any rank aborts the whole job with a message naming the rank and host: never a hang.
"""

from __future__ import annotations

from pserver.runtime.session import alone, mpi_defaults, own_session, uname_without_fork

# ruff: noqa: E402 - the imports below come after these calls on purpose
# first, before numpy, h5py and MPI_Init: a rank in its caller's session shares one process's
# CPU with every other rank of an Open MPI job on a loaded machine, MPI_Init reads the MCA
# settings from the environment, and h5py's import then forks no `uname -p`
# (pserver/runtime/session.py)
own_session()
mpi_defaults()
uname_without_fork()

import argparse
import gc
import logging
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pserver import __version__
from pserver.errors import PeerLost, RunError
from pserver.job import console
from pserver.job.launchcheck import lone_rank
from pserver.job.resume_dir import ConfigSource, resumed_line, stopped_line
from pserver.plan.config import CommConfig, unread
from pserver.plan.topology import Role
from pserver.plan.unused import unread_line
from pserver.runtime.logs import setup_logging, wait_until_read
from pserver.runtime.phases import PHASES
from pserver.runtime.rundir import run_id
from pserver.runtime.signals import STOPPED
from pserver.strategies import LOCAL_STEPS, PS, PS_OVERLAP, lookup
from pserver.strategies.adpsgd import GOSSIP
from pserver.strategies.collective import ALLREDUCE, ALLREDUCE_DELAYED

if TYPE_CHECKING:
    import numpy as np
    from mpi4py import MPI

    from pserver.ckpt.resume import Resume
    from pserver.comm.backend import Backend
    from pserver.comm.waiting import PeerLog
    from pserver.roles.aggregator import Aggregator
    from pserver.roles.dataserver import DataServer
    from pserver.roles.exchange import LearnerSide
    from pserver.roles.server import ServerShard
    from pserver.roles.statserver import StatsServer
    from pserver.roles.trainer import Trainer
    from pserver.runtime.context import Context, Plan


class Parser(argparse.ArgumentParser):
    """An argument parser that prints (usage, errors, --help, --version) on one rank only:
    every rank parses the same command line and exits the same way, so the launcher would
    otherwise print each message once per rank."""

    quiet = False

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if not self.quiet:
            super()._print_message(message, file)


def parse_args(argv: list[str] | None, rank: int = 0) -> argparse.Namespace:
    p = Parser(
        prog="pserver-run",
        description="Run one rank of a pserver job; launch every rank with mpiexec -n N.",
        epilog="example: mpiexec -n 7 pserver-run examples/quickstart.toml protocol.name=softsync",
    )
    p.quiet = rank != 0
    p.add_argument("config", nargs="?",
                   help="TOML config file (docs/config.md lists every key); with --resume, "
                        "optional: the checkpoint holds the run's config")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="override a config value; values are TOML (numbers, true, [1, 2], ...)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (a run directory, a directory of runs or its "
             "'latest' link) with its checkpoint's config (docs/checkpoints.md)",
    )
    console.add_options(p)
    p.add_argument("--version", action="version", version=f"pserver {__version__}")
    args = p.parse_intermixed_args(argv)  # CONFIG --resume DIR key=value: any order
    if args.config is not None and "=" in args.config and not Path(args.config).is_file():
        args.overrides.insert(0, args.config)  # --resume DIR key=value: no CONFIG
        args.config = None
    if args.config is None and args.resume is None and not console.asked(args):
        p.error("the following arguments are required: config (or --resume RUN_DIR)")
    args.given = list(args.overrides)  # the user's own (check_out_dir)
    return args


def console_first(argv: list[str] | None) -> int | None:
    """``--list``, ``--print-config``, ``--dry-run``: answered here, before MPI starts (its
    exit status); None for a run. A command line that does not parse is left to :func:`main`,
    whose rank 0 says why once MPI gave the ranks."""
    try:
        args = parse_args(argv, rank=1)  # quiet
    except SystemExit:
        return None
    return console.handle(args) if console.asked(args) else None


def out_dir_overrides(overrides: list[str], name: str, rid: str) -> list[str]:
    """The directories the user's ``run.out_dir=`` overrides name, expanded as the run's
    would be (``pserver.runtime.rundir``)."""
    from pserver.plan.config import parse_override
    from pserver.runtime.rundir import expand

    values = [parse_override(o) for o in overrides]
    return [expand(str(v), name, rid)[0] for k, v in values if k == "run.out_dir"]


def main(argv: list[str] | None = None) -> int:
    early = console_first(argv)
    if early is not None:
        return early
    PHASES.mark("imports")  # the interpreter's start and this module's imports
    from mpi4py import MPI

    from pserver.comm.departures import heartbeat

    with heartbeat(MPI.COMM_WORLD):  # Open MPI's ULFM (issue 22): heard while busy
        code = rank_main(argv, MPI.COMM_WORLD)
    # a run that ended well, launched, no other thread that could still call MPI: finalize
    # here, so the wait for the other ranks at the end is a phase of its own
    if code == 0 and alone():
        if not MPI.Is_finalized():  # under ULFM the heartbeat's exit has (bounded)
            MPI.Finalize()
        PHASES.mark("finalize")  # MPI_Finalize: MPICH's waits for the other ranks
        # the interpreter's exit need not collect what the run left: freed with the process
        gc.disable()
        gc.freeze()
    return code


def rank_main(argv: list[str] | None, world: MPI.Comm) -> int:
    """One rank's life under ``main``."""
    from pserver.comm.backoff import crowded_poll_max, crowded_spin
    from pserver.comm.waiting import PeerLog, Waiter
    from pserver.runtime.startup import agree, failure_message, outcome, status_of

    rank, size = world.Get_rank(), world.Get_size()
    lone = lone_rank(size)  # srun without --mpi: N worlds of 1; say so once, not N times
    args = parse_args(argv, rank if lone is None else int(not lone[1]))
    if lone is not None:
        if lone[1]:
            print(f"pserver-run: error: {lone[0]}", file=sys.stderr, flush=True)
        return 2
    from pserver.comm.collectives import learner_comm
    from pserver.runtime.context import learner_ranks, local_rank, prepare, with_initial_weights

    local, nodes, roster = local_rank(world)  # collective: before anything may fail on one rank
    # one run id for every rank (its run directory, pserver.runtime.rundir): rank 0's, collectively
    rid = world.bcast(run_id() if rank == 0 else None, root=0)
    source = ConfigSource(args.config, args.overrides, args.resume)
    learners = learner_comm(world, learner_ranks(source.load, size, nodes))
    PHASES.mark("mpi init")  # MPI_Init, the node census, the learners' communicator
    peers = PeerLog(roster)
    log = setup_logging(rank, "starting")
    prepared, resume, error, comm = None, None, None, CommConfig()
    try:
        cfg = source.load()
        if args.resume is not None:
            from pserver.ckpt.resume import check_out_dir

            check_out_dir(source.run_dir(), out_dir_overrides(args.given, cfg.run.name, rid))
        comm = cfg.comm
        log = setup_logging(rank, "starting", cfg.run.log_level)
        PHASES.attach(log)
        PHASES.mark("config")
        if rank == 0 and unread(cfg):  # once per run: a comparison's file, not a mistake
            log.info("%s", unread_line(unread(cfg)))
        plan, backend = prepare(cfg, size, rank, log, local, nodes, peers, rid=rid)
        PHASES.mark("prepare")  # the dataset read (data and stats servers), the model
        if args.resume is not None:
            from pserver.ckpt.resume import check_state, open_resume

            resume = open_resume(source.run_dir(), plan.cfg, size, rank, plan.role.value,
                                 from_file=args.config is not None)
            check_state(plan, resume)
        if plan.cfg.model.init_from and args.resume is None:  # a resume's w0 is its checkpoint's
            plan = with_initial_weights(plan)
        if plan.cfg.run.checkpoint_interval > 0:  # periodic checkpoints: refused as --resume is
            from pserver.ckpt.resume import refuse_periodic

            refuse_periodic(plan.cfg)
        prepared = plan, backend
    except BaseException as e:  # every failure must reach the agreement, or the others hang
        error = e
    here = local[1]  # the ranks of this node: a crowded node's waits sleep longer, spin less
    poll_max = crowded_poll_max(comm.poll_max, here)
    waiter = Waiter(log, peers, comm.poll_min, poll_max, comm.stall_timeout, crowded_spin(here))
    try:
        statuses = agree(world, status_of(error), waiter)
        PHASES.mark("agreement")
    except PeerLost as e:  # a rank died before the agreement: nobody can train
        die(f"pserver-run: error: rank {rank} on {socket.gethostname()} {e}", world)
        return 1  # not reached
    code, speaks, suffix = outcome(statuses, rank)
    if code:
        from pserver.runtime.outdir import undo_out_dir

        undo_out_dir()  # the statistics server's check created it: a refused run writes nothing
        if speaks:
            assert error is not None
            message = failure_message(error, rank, size)
            print(f"pserver-run: error: {message}{suffix}", file=sys.stderr, flush=True)
        return code
    assert prepared is not None
    plan, backend = prepared
    from pserver.ckpt.resume import unsupported
    from pserver.runtime.signals import STOP

    if unsupported(plan.cfg) is None:  # else SIGTERM keeps its default action: the rank ends
        STOP.install()
    hosts, pids = tuple(p.host for p in roster.procs), tuple(p.pid for p in roster.procs)
    try:
        code = run(plan, Start(backend, peers, learners, hosts, pids, resume), world)
    except BaseException as e:
        die(abort_message(e, plan, peers), world)
        return 1  # not reached: Abort ends every rank
    if code == STOPPED and plan.role is Role.STATS:  # the rank that committed the checkpoint
        print(stopped_line(plan.cfg.run.out_dir, size), file=sys.stderr, flush=True)
    return code


def abort_message(error: BaseException, plan: Plan, peers: PeerLog) -> str:
    """What a rank says before aborting the job: one line for a failure whose message says
    all (a lost peer, a diverged run), the traceback for anything else."""

    who = f"rank {plan.rank} ({plan.layout.describe(plan.rank)}) on {socket.gethostname()}"
    mpi_error = mpi_cause(error)  # also behind a comm thread's "the thread failed" error
    if mpi_error is not None:  # outside a wait: which peer is unknown, ask the roster
        error = peers.lost(None, mpi_error)
    if isinstance(error, PeerLost) and not error.named:  # maybe our own fault: say where
        return f"pserver-run: {who}: {error}; aborting the job:\n{traceback.format_exc()}"
    if isinstance(error, RunError):
        return f"pserver-run: {who}: {error}; aborting the job"
    return f"pserver-run: {who} failed; aborting the job:\n{traceback.format_exc()}"


def mpi_cause(error: BaseException | None) -> BaseException | None:
    """The MPI error that ``error`` is or was raised from (its ``__cause__`` chain), if any."""
    from mpi4py import MPI

    seen = 0
    while error is not None and seen < 16:  # a chain is short; a cycle must not loop forever
        if isinstance(error, MPI.Exception):
            return error
        error, seen = error.__cause__, seen + 1
    return None


def die(message: str, world: MPI.Comm) -> None:
    """Print ``message``, make sure the launcher has read it, and abort every rank."""
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    wait_until_read(sys.stdout)
    wait_until_read(sys.stderr)
    world.Abort(1)


@dataclass(frozen=True)
class Start:
    """What ``rank_main`` hands :func:`run` beside the plan: the runtime's parts built before
    the agreement (the backend the model was built on, the waits' PeerLog, the learners'
    communicator, every rank's host and PID, the checkpoint this rank resumes from)."""

    backend: Backend
    peers: PeerLog
    learner_comm: MPI.Comm | None
    hosts: tuple[str, ...]
    pids: tuple[int, ...]
    resume: Resume | None


def run(plan: Plan, start: Start, world: MPI.Comm) -> int:
    """Complete the runtime (channels, shared windows, the common clock), then build the
    role's driver from the plan and the runtime, run it to the end of training, checkpoint;
    the exit status (``pserver.ckpt.drivers.end``: 0 done, 75 stopped by a signal, 74
    checkpoint not written; ``pserver.ckpt.drivers.periodic`` for ``run.checkpoint_interval``)."""
    from pserver.ckpt.drivers.periodic import run_parts
    from pserver.comm.backoff import crowding
    from pserver.comm.channels import Channels
    from pserver.comm.crowd import batch_task
    from pserver.comm.departures import departures_of
    from pserver.comm.doorbell import Doorbells
    from pserver.optim.blas import limit_blas_threads
    from pserver.runtime.context import Context, LearnerComm, Runtime, make_waiter

    cfg, resume, peers = plan.cfg, start.resume, start.peers
    log = setup_logging(plan.rank, plan.layout.describe(plan.rank), cfg.run.log_level)
    if plan.rank == 0:
        log_provenance(plan, log, start.hosts, start.pids)
        if resume is not None:
            log.info("%s", resumed_line(resume, cfg))
        if plan.w0 is not None:
            log.info("initial weights: the final model of %s (model.init_from)",
                     cfg.model.init_from)  # fmt: skip
    if plan.role is Role.STATS:  # the rank that read the data and chose its scaling
        from learners.describe import startup_line

        log.info("%s", startup_line(plan.dataset, cfg.model, plan.model))
    channels = Channels.create(world)
    # issue 22: None unless Open MPI's ULFM
    peers.departures = departures_of(world, channels, plan.layout.learners, cfg)
    # a crowded node's waits sleep on doorbells and its learners yield to the servers
    # (pserver.comm.crowd); not under ULFM, whose runs keep their behaviour (the window's Free
    # is collective over the node, which a lost learner would block)
    crowded = cfg.comm.crowded == "auto" and peers.departures is None and crowding(
        plan.nodes.count(plan.nodes[plan.rank]) if plan.nodes else 1) > 1.0  # fmt: skip
    peers.bells = Doorbells.create(world, crowded)
    if peers.bells is not None:
        log.debug("crowded node: doorbells for its %d ranks", len(peers.bells.words))
    if crowded and plan.role is Role.LEARNER and batch_task(log):
        log.debug("crowded node: this learner is a SCHED_BATCH task")
    # a thread that waits for the GIL gets it after at most this long: Python's default 5 ms
    # starves a comm thread beside pure-Python compute (docs/architecture.md, "The
    # communication thread and the GIL", has the figures)
    sys.setswitchinterval(cfg.comm.switch_interval)
    limit_blas_threads(cfg.run.blas_threads, log)
    # same seed (or the same warm-start file, model.init_from) on every rank: the same w0
    weights = plan.model.init_params(cfg.run.seed) if plan.w0 is None else plan.w0
    if plan.role is Role.SERVER:  # imports of the first update happen before the clock starts
        from pserver.optim.rules import preload

        preload(cfg.optim.rule, start.backend.xp, weights.dtype)
    shm = None
    if cfg.comm.transport == "shm":
        from pserver.comm.shm import SharedWindows

        shm = SharedWindows(
            world, plan.layout, list(plan.blocks), weights.dtype, list(plan.nodes),
            cfg.comm.versions,
        )  # fmt: skip
    # the server may still be loading its update's imports: a blocking Barrier spins MPICH's
    # progress engine on every other rank meanwhile (~1 s of CPU each per launch)
    PHASES.mark("setup")  # channels, BLAS limit, initial weights, the server's imports
    wait = make_waiter(plan, log, peers)
    wait.wait(world.Ibarrier(), "every rank to be ready to train (the start barrier)")
    PHASES.mark("start barrier")
    # a resumed run's clock goes on from the checkpointed run's (the dump's times continue)
    t0 = time.time() - (resume.elapsed if resume is not None else 0.0)
    learners = LearnerComm(start.learner_comm)  # ADPSGD's repair may replace it (ULFM)
    runtime = Runtime(
        log, start.backend, channels, peers, t0, shm, learners, start.hosts, start.pids, resume
    )  # fmt: skip
    # one part, or one per periodic checkpoint (each driver built from the last one's state,
    # its context the same plan and runtime with that state as the resume)
    code = run_parts(Context(plan, runtime), world, lambda ctx: DRIVERS[ctx.role](ctx, weights))
    PHASES.mark("training")  # the driver's run, its final dump and checkpoint included
    if shm is not None:
        shm.free()
    channels.free()
    if peers.bells is not None:  # after the last ring of the training
        peers.bells.free()
    if learners.comm is not None:  # every learner gets here once its run has ended
        learners.comm.Free()
    PHASES.mark("finish")
    return code


def log_provenance(
    plan: Plan, log: logging.Logger, hosts: tuple[str, ...], pids: tuple[int, ...]
) -> None:
    """With which code, the layout in one line (``pserver.plan.layout_line``), and every rank's
    role in one line per host (pserver.runtime.provenance)."""
    from pserver.plan.layout_line import layout_line
    from pserver.runtime.provenance import git_commit, host_lines, library_versions, rank_table

    v = library_versions()
    commit = git_commit() or "not a git checkout"
    log.info(
        "pserver %s (%s), Python %s, numpy %s, mpi4py %s, h5py %s, %s; run directory %s",
        v["pserver"], commit, v["python"], v["numpy"], v["mpi4py"], v["h5py"], v["mpi"],
        plan.cfg.run.out_dir,
    )  # fmt: skip
    c = plan.cfg.cluster
    log.info("%s", layout_line(plan.layout, plan.cfg.protocol.name, c.tree_fanout,
                               c.bcast_fanout))  # fmt: skip
    # every rank's role and PID at INFO: when a rank is killed, MPICH's launcher ends the job
    # naming only the PID of the process that died, which these lines map to a rank
    for line in host_lines(rank_table(plan.layout, list(plan.nodes), list(hosts), list(pids))):
        log.info("%s", line)


# -- the role drivers: each imports its own module only when its rank plays that role --------


def server(ctx: Context, weights: np.ndarray) -> ServerShard:
    from pserver.roles.server import ServerShard

    return ServerShard(ctx, weights)


def learner(ctx: Context, weights: np.ndarray) -> Trainer:
    """A trainer with the exchange the strategy names for ``comm.mode``."""
    from pserver.roles.prefetch import DataSource, Prefetcher
    from pserver.roles.trainer import Trainer

    strategy = lookup(ctx.cfg.protocol.name)
    if not strategy.ranks.servers:  # the learner owns the model: it lives on its device
        weights = ctx.xp.asarray(weights)
    exchange = strategy.exchange(ctx.cfg.comm.mode)
    d = ctx.cfg.data
    source = DataSource(ctx.channels.io, ctx.layout.data, ctx.rank, d.batch_size,
                        ctx.dataset.n_features, d.prefetch, ctx.backend, ctx.log)  # fmt: skip
    built = EXCHANGES[exchange]()(learner_side(ctx), weights)
    return Trainer(ctx, built, Prefetcher(source, ctx.waiter()))


def learner_side(ctx: Context) -> LearnerSide:
    """What a learner's exchange reads of the run (``pserver.roles.exchange.LearnerSide``)."""
    from pserver.roles.exchange import LearnerSide

    m = ctx.model
    return LearnerSide(
        ctx.cfg, ctx.layout, ctx.rank, ctx.blocks, ctx.train_size,
        m.n_params * m.dtype.itemsize, ctx.backend, ctx.channels, ctx.peers, ctx.log, ctx.shm,
        ctx.runtime.learners, ctx.resume is not None, ctx.now, ctx.waiter,
    )  # fmt: skip


def aggregator(ctx: Context, weights: np.ndarray) -> Aggregator:
    from pserver.roles.aggregator import Aggregator

    return Aggregator(ctx, weights)


def data_server(ctx: Context, weights: np.ndarray) -> DataServer:  # weights: unused
    from pserver.roles.dataserver import DataServer

    return DataServer(ctx)


def stats_server(ctx: Context, weights: np.ndarray) -> StatsServer:  # weights: unused
    from pserver.roles.statserver import StatsServer

    return StatsServer(ctx)


def ps_exchange() -> type:
    from pserver.roles.learner import PSExchange

    return PSExchange


def ps_overlap_exchange() -> type:
    from pserver.roles.overlap import OverlapExchange

    return OverlapExchange


def allreduce_exchange() -> type:
    from pserver.roles.allreduce import SyncExchange

    return SyncExchange


def hybrid_exchange() -> type:
    from pserver.roles.hybrid import HybridExchange

    return HybridExchange


def local_steps_exchange() -> type:
    from pserver.roles.local_steps import LocalStepsExchange

    return LocalStepsExchange


def gossip_exchange() -> type:
    from pserver.roles.gossip_exchange import GossipExchange

    return GossipExchange


#: Role -> a function (ctx, w0) -> the driver whose run() is the rank's whole life.
DRIVERS = {
    Role.SERVER: server,
    Role.LEARNER: learner,
    Role.AGGREGATOR: aggregator,
    Role.DATA: data_server,
    Role.STATS: stats_server,
}
#: A strategy's learner exchange (``pserver.strategies``, ``Strategy.exchanges``) -> its class.
EXCHANGES = {
    PS: ps_exchange,
    PS_OVERLAP: ps_overlap_exchange,
    LOCAL_STEPS: local_steps_exchange,
    ALLREDUCE: allreduce_exchange,
    ALLREDUCE_DELAYED: hybrid_exchange,
    GOSSIP: gossip_exchange,
}


if __name__ == "__main__":
    sys.exit(main())
