"""Everything a rank knows before training: validated config, layout, data, model, blocks.

``prepare`` runs on every rank and raises a ``PserverError`` for any bad input; the CLI makes
the ranks agree on success before anyone starts training (``pserver.runtime.startup``), whatever a
rank
raised, so no failure leaves one rank waiting on another that has already failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pserver.comm.backoff import crowded_poll_max, crowded_spin
from pserver.comm.channels import Channels
from pserver.comm.liveness import Roster, this_process
from pserver.comm.records import RecordBuffer
from pserver.comm.waiting import PeerLog, Waiter
from pserver.errors import ConfigError
from pserver.plan.config import Config, check_fail_learner, inject_plan, revised
from pserver.plan.limits import NodeBudget, RunSizes, available_memory, check_blas_threads
from pserver.plan.topology import Block, Layout, Role, make_layout, split_blocks
from pserver.runtime.outdir import check_out_dir
from pserver.runtime.rundir import expand, run_id
from pserver.strategies import lookup
from pserver.strategies.parameter_server import check_pull_blocks

if TYPE_CHECKING:
    import numpy as np
    from mpi4py import MPI

    from learners.contract import Model
    from learners.data import Dataset
    from pserver.ckpt.resume import Resume
    from pserver.comm.backend import Backend
    from pserver.comm.shm import SharedWindows

DUMP_NAME = "stats.h5"
DATA_ROLES = (Role.DATA, Role.STATS)  # the ranks that load the dataset; the others see its shape
DATA_PARTS = {Role.DATA: "train", Role.STATS: "test"}  # what each keeps (learners.data)


@dataclass(frozen=True)
class Plan:
    """What preparation decided, from the config and the rank count alone: the same on every
    rank but for ``rank`` and what this rank loaded. Immutable, config included (``cfg`` is
    sealed: ``run.out_dir`` expanded and ``model.init_from`` resolved into it, never written
    back; :func:`pserver.plan.config.revised` makes a changed copy)."""

    cfg: Config
    layout: Layout
    rank: int
    dataset: Dataset
    model: Model  # built on this rank's backend (Runtime.backend)
    blocks: tuple[Block, ...]
    nodes: tuple[int, ...]  # the node of every rank (its lowest rank)
    latest: Path | None = None  # the run directory's ``latest`` link (pserver.runtime.rundir)
    # model.init_from: the initial weights read from another run (warm start), else None
    w0: np.ndarray | None = None

    @property
    def role(self) -> Role:
        return self.layout.role(self.rank)

    @property
    def dump_path(self) -> Path:
        return Path(self.cfg.run.out_dir) / DUMP_NAME

    @property
    def train_size(self) -> int:
        return self.dataset.n_train

    def blocks_of(self, shard: int) -> list[Block]:
        return [b for b in self.blocks if b.shard == shard]


@dataclass
class LearnerComm:
    """The learners' communicator on a learner (None elsewhere): the one part of the runtime
    that may change during a run, when ADPSGD's ring is repaired after a lost learner
    (``pserver.roles.gossip``, Open MPI's ULFM) and the survivors' communicator replaces it.
    ``pserver.job.cli.run`` frees whichever it holds at the end."""

    comm: MPI.Comm | None = None

    def replace(self, comm: MPI.Comm) -> None:
        """The survivors' communicator after a repair (the old one was revoked)."""
        self.comm = comm


@dataclass(frozen=True)
class Runtime:
    """What this rank holds to train, built before any driver (``pserver.job.cli.run``):
    communicators, channels, shared windows, the logger, the common clock, the resume state.
    Immutable: a periodic checkpoint's next part gets a new one (:meth:`Context.resumed`)."""

    log: logging.Logger
    backend: Backend
    channels: Channels
    peers: PeerLog
    t0: float  # the common start (every rank passed a barrier just before), continued on resume
    shm: SharedWindows | None = None  # comm.transport = "shm"
    learners: LearnerComm = field(default_factory=LearnerComm)  # the learners' communicator
    hosts: tuple[str, ...] = ()  # the host of every rank (provenance)
    # every rank's process id: the launcher names a dead rank by its PID only (provenance)
    pids: tuple[int, ...] = ()
    resume: Resume | None = None  # the checkpoint this rank continues from


@dataclass(frozen=True)
class Context:
    """A driver's whole world: the plan and the runtime, both complete before it is built and
    never assigned afterwards (``tests/test_context_frozen.py``). The properties read through
    to them, so a driver writes ``ctx.cfg`` and ``ctx.channels`` alike."""

    plan: Plan
    runtime: Runtime

    def resumed(self, resume: Resume) -> Context:
        """This context with another resume state (a periodic checkpoint's next part)."""
        return replace(self, runtime=replace(self.runtime, resume=resume))

    # -- the plan's --
    @property
    def cfg(self) -> Config:
        return self.plan.cfg

    @property
    def layout(self) -> Layout:
        return self.plan.layout

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def dataset(self) -> Dataset:
        return self.plan.dataset

    @property
    def model(self) -> Model:
        return self.plan.model

    @property
    def blocks(self) -> tuple[Block, ...]:
        return self.plan.blocks

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.plan.nodes

    @property
    def latest(self) -> Path | None:
        return self.plan.latest

    @property
    def w0(self) -> np.ndarray | None:
        return self.plan.w0

    @property
    def role(self) -> Role:
        return self.plan.role

    @property
    def dump_path(self) -> Path:
        return self.plan.dump_path

    @property
    def train_size(self) -> int:
        return self.plan.train_size

    def blocks_of(self, shard: int) -> list[Block]:
        return self.plan.blocks_of(shard)

    # -- the runtime's --
    @property
    def log(self) -> logging.Logger:
        return self.runtime.log

    @property
    def backend(self) -> Backend:
        return self.runtime.backend

    @property
    def xp(self) -> ModuleType:
        return self.runtime.backend.xp

    @property
    def channels(self) -> Channels:
        return self.runtime.channels

    @property
    def peers(self) -> PeerLog:
        return self.runtime.peers

    @property
    def shm(self) -> SharedWindows | None:
        return self.runtime.shm

    @property
    def learner_comm(self) -> MPI.Comm | None:
        return self.runtime.learners.comm

    @property
    def t0(self) -> float:
        return self.runtime.t0

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.runtime.hosts

    @property
    def pids(self) -> tuple[int, ...]:
        return self.runtime.pids

    @property
    def resume(self) -> Resume | None:
        return self.runtime.resume

    def now(self) -> float:
        """Seconds since the common start (all ranks passed a barrier just before ``t0``)."""
        return time.time() - self.t0

    def waiter(self) -> Waiter:
        return make_waiter(self.plan, self.log, self.peers)

    def records(self) -> RecordBuffer:
        s = self.cfg.stats
        return RecordBuffer(
            self.channels.stats, self.layout.stats, s.flush_interval, s.buffer_rows, self.log
        )


def make_waiter(plan: Plan, log: logging.Logger, peers: PeerLog) -> Waiter:
    """A Waiter with ``[comm]``'s back-off, stretched by the ranks per core of this rank's
    node (:func:`pserver.comm.backoff.crowded_poll_max`, :func:`~.crowded_spin`)."""
    c = plan.cfg.comm
    here = plan.nodes.count(plan.nodes[plan.rank]) if plan.nodes else 1
    return Waiter(
        log, peers, c.poll_min, crowded_poll_max(c.poll_max, here), c.stall_timeout,
        crowded_spin(here),
    )  # fmt: skip


def prepare(
    cfg: Config,
    world_size: int,
    rank: int,
    log: logging.Logger,
    local: tuple[int, int] = (0, 1),
    nodes: list[int] | None = None,
    peers: PeerLog | None = None,
    available: int | None | bool = True,
    rid: str | None = None,
) -> tuple[Plan, Backend]:
    """Validate every input that could stop the run later; identical work on every rank.
    The plan (with its config resolved: ``cfg`` itself is left as it was) and this rank's
    backend, on which the plan's model was built.

    No collective call happens here: a rank that fails must not leave the others inside one.
    ``local`` is this rank's (index, count) among the ranks of its node, for the GPU choice;
    ``nodes`` the node of every rank, for placing a tree's leaf aggregators and the memory
    check; ``peers`` the PeerLog (with the roster) the rank's waits will use; ``available``
    the bytes the node may still allocate (True: ask the node; None: do not check); ``rid``
    the run id every rank got from rank 0 (None: this process's own, for one-process use).
    Only the ranks that read the data (the data server, and the statistics server for its test
    set) load the dataset; the others check its shapes and dtypes (``describe_dataset``).
    """
    from mpi4py import MPI

    from learners.precheck import check_model_source

    check_model_source(cfg.model)  # first: a typo in model.module must not wait for torch

    from learners.data import data_size, describe_dataset, load_dataset
    from learners.models import build_model
    from pserver.comm.backend import select_backend

    check_thread_level(cfg.comm.mode, MPI.Query_thread())
    check_exchange_thread(cfg, MPI.Query_thread())
    out_dir, latest = expand(cfg.run.out_dir, cfg.run.name, rid or run_id())
    cfg = revised(cfg, "run", out_dir=out_dir)  # the plan's, sealed; the caller's unchanged
    layout = make_layout(world_size, cfg, nodes)
    if cfg.stats.tensorboard and layout.role(rank) is Role.STATS:  # the rank that writes them
        from pserver.dump.tensorboard import require

        require()
    n_learners = len(layout.learners)
    strategy = lookup(cfg.protocol.name)
    if strategy.protocol is not None:  # a shard protocol that cannot run with this λ fails here
        strategy.protocol(cfg, n_learners)
    if n_learners < strategy.min_learners:
        raise ConfigError(
            f"protocol.name = {strategy.name!r} needs at least {strategy.min_learners} learners, "
            f"this run has {n_learners}: add ranks or set cluster.learners"
        )
    inject_plan(cfg).validate(len(layout.servers), n_learners)
    check_fail_learner(cfg, n_learners)
    check_blas_threads(cfg.run.blas_threads)
    nodes = nodes or [0] * world_size
    free = available_memory() if available is True else available
    budget = node_budget(layout, nodes, rank, free or None)
    data_bytes, data_what = data_size(cfg.data)
    budget.check_data(data_bytes, data_what)
    part = DATA_PARTS.get(layout.role(rank))  # the data server's, the statistics server's
    if part is None:
        dataset = describe_dataset(cfg.data, cfg.run.seed)
    else:
        dataset = load_dataset(cfg.data, cfg.run.seed, part)
    if layout.role(rank) is Role.STATS:  # it tests on the test set only
        dataset = dataset.test_only()
    if rank == 0 and dataset.scaling is not None and dataset.scaling.warning:  # said once
        log.warning("%s", dataset.scaling.warning)
    backend = select_backend("cpu", 0, 1)
    if layout.role(rank) in (Role.LEARNER, Role.SERVER):
        backend = select_backend(cfg.run.device, *local, cfg.comm.cuda_aware)
        if cfg.comm.transport == "shm" and backend.xp.__name__ != "numpy":
            raise ConfigError(
                'comm.transport = "shm" shares host memory between ranks, but the model is on '
                'a GPU here: set run.device = "cpu" or comm.transport = "messages"'
            )
    model = build_model(cfg.model, dataset.n_features, dataset.n_classes, backend.xp)
    blocks = split_blocks(  # sizes only: nothing allocated yet
        model.n_params, model.layer_sizes, cfg.blocks.split, cfg.blocks.count, cfg.cluster.servers
    )
    if strategy.uses("pull_fraction"):  # blocks.split = "layer": the count is known only now
        check_pull_blocks(cfg.protocol.pull_fraction, len(blocks))
    if cfg.comm.transport == "shm":  # /dev/shm is the tighter limit of the two
        check_shared_memory(layout, blocks, nodes, model.dtype.itemsize, cfg.comm.versions)
    budget.check_run(data_bytes, run_sizes(cfg, model, dataset), size_keys(cfg))
    if layout.role(rank) is Role.STATS:  # the rank that writes there; last, so that bad input
        check_out_dir(cfg.run.out_dir, DUMP_NAME, cfg.run.overwrite)  # undone if refused
    peers = peers if peers is not None else PeerLog()
    peers.names = layout.describe
    plan = Plan(cfg, layout, rank, dataset, model, tuple(blocks), tuple(nodes), latest)
    return plan, backend


def node_budget(layout: Layout, nodes: list[int], rank: int, available: int | None) -> NodeBudget:
    """The memory of ``rank``'s node and the roles of the ranks placed on it."""
    here = [r for r in range(layout.world_size) if nodes[r] == nodes[rank]]
    holders = [layout.role(r).value for r in here if layout.role(r) in DATA_ROLES]
    return NodeBudget(available, [layout.role(r).value for r in here], rank, holders)


def run_sizes(cfg: Config, model: Any, dataset: Any) -> RunSizes:
    return RunSizes(
        n_params=model.n_params,
        itemsize=model.dtype.itemsize,
        activations=model.activation_bytes(),
        n_features=dataset.n_features,
        batch_size=cfg.data.batch_size,
        prefetch=cfg.data.prefetch,
        on_gpu=cfg.run.device != "cpu",
        n_servers=cfg.cluster.servers,
        versions=cfg.comm.versions or 2,
    )


def size_keys(cfg: Config) -> dict[str, str]:
    """For each part of the memory estimate, the keys that set it (the error names them)."""
    m = cfg.model
    model = {
        "mlp": f"model.hidden = {m.hidden}",
        "cnn": f"model.channels = {m.channels}",
        "null": f"model.size_mib = {m.size_mib}",
        "torch": f"model.module = {m.module!r}",
        "python": f"model.module = {m.module!r}",
    }.get(m.kind, f"model.kind = {m.kind!r} (the data's features x classes)")
    return {
        "model": model,
        "activations": f"data.batch_size = {cfg.data.batch_size} with {model}",
        "prefetch": f"data.prefetch = {cfg.data.prefetch} (x data.batch_size = "
        f"{cfg.data.batch_size})",
    }


# MPI_THREAD_SINGLE < FUNNELED < SERIALIZED < MULTIPLE: the standard fixes the order, the
# library the numbers, so mpi4py's constants are looked up when checked.
THREAD_LEVELS = ("THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE")


def check_thread_level(mode: str, provided: int, levels: dict[str, int] | None = None) -> None:
    """comm.mode = "thread" needs MPI_THREAD_MULTIPLE: its communication thread tests the
    learner's requests while the compute thread posts pushes and fetches minibatches, so two
    threads call MPI at once. Checked on every rank before training; ``levels`` maps the
    names of ``THREAD_LEVELS`` to the library's values (default: mpi4py's constants)."""
    if mode != "thread":
        return
    if levels is None:
        from mpi4py import MPI

        levels = {name: getattr(MPI, name) for name in THREAD_LEVELS}
    if provided >= levels["THREAD_MULTIPLE"]:
        return
    names = {v: k for k, v in levels.items()}
    got = f"MPI_{names.get(provided, str(provided))}"
    raise ConfigError(
        f'comm.mode = "thread" calls MPI from two threads at once, which needs '
        f"MPI_THREAD_MULTIPLE; this MPI library provides {got} (check MPI4PY_RC_THREAD_LEVEL "
        f'and how the library was built), or use comm.mode = "nonblocking": the same overlap '
        "driven from one thread"
    )


def check_exchange_thread(cfg: Config, provided: int, levels: dict[str, int] | None = None) -> None:
    """An exchange that always runs a communication thread (HYBRID's, whatever ``comm.mode``:
    its allreduce overlaps the next gradient; ADPSGD's: a receiver answers while it computes)
    needs MPI_THREAD_MULTIPLE too (issue 12)."""
    from pserver.strategies.collective import THREADED

    s = lookup(cfg.protocol.name)
    if s.exchange(cfg.comm.mode) not in THREADED:
        return
    if levels is None:
        from mpi4py import MPI

        levels = {name: getattr(MPI, name) for name in THREAD_LEVELS}
    if provided >= levels["THREAD_MULTIPLE"]:
        return
    got = {v: k for k, v in levels.items()}.get(provided, str(provided))
    what = "allreduce" if s.name == "hybrid" else "exchange"  # ADPSGD: with a neighbour
    raise ConfigError(
        f"protocol.name = {s.name!r} runs its {what} in a communication thread while the "
        f"next gradient is computed, so two threads call MPI at once, which needs "
        f"MPI_THREAD_MULTIPLE; this MPI library provides MPI_{got} (check "
        'MPI4PY_RC_THREAD_LEVEL and how the library was built), or use protocol.name = "sync"'
    )


def check_shared_memory(
    layout: Layout, blocks: list[Block], nodes: list[int], itemsize: int, versions: int = 0
) -> None:
    """comm.transport = "shm": the window must fit in the node's shared memory (/dev/shm)."""
    import shutil

    from pserver.comm.shm import window_bytes

    need = window_bytes(layout, blocks, nodes, itemsize, versions)
    shm_dir = Path("/dev/shm")
    if not shm_dir.is_dir():
        return  # no tmpfs to ask (not Linux): MPI reports a failed allocation itself
    free = shutil.disk_usage(shm_dir).free
    if need > 0.9 * free:
        raise ConfigError(
            f'comm.transport = "shm" needs {need / 2**20:.0f} MiB of shared memory per node '
            f"(weight versions + one gradient slot per learner), but {shm_dir} has "
            f"{free / 2**20:.0f} MiB free: use comm.transport = \"messages\", more blocks or "
            "shards, or a larger /dev/shm"
        )


def local_rank(comm: Any) -> tuple[tuple[int, int], list[int], Roster]:
    """This rank's (index, count) among the ranks of its node, the node of every rank, and
    the process of every rank (for naming a peer that died, :mod:`pserver.comm.liveness`).

    Collective over ``comm``, done before anything that can fail. A node is named by the
    lowest rank on it.
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local = (node.Get_rank(), node.Get_size())
        leader = node.allreduce(comm.Get_rank(), op=MPI.MIN)
        every = comm.allgather((leader, this_process()))
    finally:
        node.Free()
    return local, [n for n, _ in every], Roster([p for _, p in every])


def learner_ranks(
    load: Callable[[], Config], world_size: int, nodes: list[int]
) -> tuple[int, ...]:
    """The learners' ranks, for the communicator built before validation
    (:func:`pserver.comm.collectives.learner_comm`, collective on every rank); none when the
    config or the layout is bad, which ``prepare`` then reports on every rank.

    ``load``: the entry point's config loader (CONFIG and overrides, or a checkpoint's config
    with ``--resume``). The layout is computed again by ``prepare`` from the same config and
    nodes, so the communicator's members are exactly ``ctx.layout.learners``.
    """
    import warnings

    try:
        with warnings.catch_warnings():  # said once, when prepare loads the config again
            warnings.simplefilter("ignore")
            return make_layout(world_size, load(), nodes).learners
    except Exception:  # noqa: BLE001 - reported by prepare, after the collective calls
        return ()


def with_initial_weights(plan: Plan) -> Plan:
    """The plan with ``model.init_from`` resolved (the run, not its ``latest`` link: recorded
    so) and the initial weights read from that run (a warm start; a resume's are its
    checkpoint's)."""
    from dataclasses import asdict

    from pserver.ckpt.warm_start import load_initial_weights, resolved

    cfg = revised(plan.cfg, "model", init_from=resolved(plan.cfg.model.init_from))
    w0 = load_initial_weights(
        cfg.model.init_from, asdict(cfg.model), plan.model.n_params, plan.model.dtype
    )
    return replace(plan, cfg=cfg, w0=w0)
