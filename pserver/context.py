"""Everything a rank knows before training: validated config, layout, data, model, blocks.

``prepare`` runs on every rank and raises a ``PserverError`` for any bad input; the CLI makes
the ranks agree on success before anyone starts training, so bad input never leaves one rank
waiting on another that has already failed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pserver.comm.channels import Channels
from pserver.comm.records import RecordBuffer
from pserver.comm.waiting import PeerLog, Waiter
from pserver.config import Config, inject_plan
from pserver.errors import ConfigError
from pserver.protocols import make_protocol
from pserver.topology import Block, Layout, Role, make_layout, split_blocks

DUMP_NAME = "stats.h5"


@dataclass
class Context:
    cfg: Config
    layout: Layout
    rank: int
    dataset: Any  # learners.data.Dataset
    model: Any  # learners.models.Model
    blocks: list[Block]
    log: logging.Logger
    backend: Any = None  # pserver.backend.Backend
    channels: Channels | None = None
    shm: Any = None  # pserver.comm.shm.SharedWindows when comm.transport = "shm"
    nodes: list[int] = field(default_factory=list)  # the node of every rank (its lowest rank)
    peers: PeerLog = field(default_factory=PeerLog)
    t0: float = field(default_factory=time.time)

    @property
    def role(self) -> Role:
        return self.layout.role(self.rank)

    @property
    def xp(self) -> Any:
        return self.backend.xp

    @property
    def dump_path(self) -> Path:
        return Path(self.cfg.run.out_dir) / DUMP_NAME

    @property
    def train_size(self) -> int:
        return len(self.dataset.y_train)

    def now(self) -> float:
        """Seconds since the common start (all ranks passed a barrier just before ``t0``)."""
        return time.time() - self.t0

    def waiter(self) -> Waiter:
        c = self.cfg.comm
        return Waiter(self.log, self.peers, c.poll_min, c.poll_max, c.stall_timeout)

    def records(self) -> RecordBuffer:
        assert self.channels is not None
        return RecordBuffer(self.channels.stats, self.layout.stats, self.cfg.stats.flush_interval)

    def blocks_of(self, shard: int) -> list[Block]:
        return [b for b in self.blocks if b.shard == shard]


def prepare(
    cfg: Config,
    world_size: int,
    rank: int,
    log: logging.Logger,
    local: tuple[int, int] = (0, 1),
    nodes: list[int] | None = None,
) -> Context:
    """Validate every input that could stop the run later; identical work on every rank.

    No collective call happens here: a rank that fails must not leave the others inside one.
    ``local`` is this rank's (index, count) among the ranks of its node, for the GPU choice;
    ``nodes`` the node of every rank, for placing a tree's leaf aggregators.
    """
    from mpi4py import MPI

    from learners.data import load_dataset
    from learners.models import build_model
    from pserver.backend import select_backend

    check_thread_level(cfg.comm.mode, MPI.Query_thread())
    layout = make_layout(world_size, cfg, nodes)
    n_learners = len(layout.learners)
    make_protocol(cfg, n_learners)  # a protocol that cannot run with this λ fails here
    inject_plan(cfg).validate(len(layout.servers), n_learners)
    dataset = load_dataset(cfg.data, cfg.run.seed)
    backend = select_backend("cpu", 0, 1)
    if layout.role(rank) in (Role.LEARNER, Role.SERVER):
        backend = select_backend(cfg.run.device, *local, cfg.comm.cuda_aware)
        if cfg.comm.transport == "shm" and backend.xp.__name__ != "numpy":
            raise ConfigError(
                'comm.transport = "shm" shares host memory between ranks, but the model is on '
                'a GPU here: set run.device = "cpu" or comm.transport = "messages"'
            )
    model = build_model(cfg.model, dataset.n_features, dataset.n_classes, backend.xp)
    blocks = split_blocks(
        model.n_params, model.layer_sizes, cfg.blocks.split, cfg.blocks.count, cfg.cluster.servers
    )
    nodes = nodes or [0] * world_size
    if cfg.comm.transport == "shm":
        check_shared_memory(layout, blocks, nodes, model.dtype.itemsize, cfg.comm.versions)
    dump = Path(cfg.run.out_dir) / DUMP_NAME
    if dump.exists() and not cfg.run.overwrite:
        raise ConfigError(
            f"{dump} already holds a dump: pass run.overwrite=true to replace it, or choose "
            "another run.out_dir"
        )
    return Context(cfg, layout, rank, dataset, model, blocks, log, backend, nodes=nodes)


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


def local_rank(comm: Any) -> tuple[tuple[int, int], list[int]]:
    """This rank's (index, count) among the ranks of its node, and the node of every rank.

    Collective over ``comm``. A node is named by the lowest rank on it.
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = node.allreduce(comm.Get_rank(), op=MPI.MIN)
        return (node.Get_rank(), node.Get_size()), comm.allgather(leader)
    finally:
        node.Free()
