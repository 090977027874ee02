"""Build a simulated run from a config, run it on an event loop, write its dump.

``simulate(cfg)`` is the whole of ``pserver-sim CONFIG``: λ = ``cluster.learners``,
``cluster.servers`` shards over ``blocks.count`` blocks (``pserver.sim.servers``,
``pserver.sim.shard``), λ blocking learners (``pserver.sim.learner``; BMUF's and MA's
``pserver.sim.local_steps``) or overlapped ones (``pserver.sim.overlap``), PP-ASGD's predictions
(``pserver.sim.predict``), the aggregator and broadcast trees (``pserver.sim.tree``) — or, for
the learners-only strategies, their run
(``pserver.sim.collective``: SYNC, HYBRID; ``pserver.sim.gossip``: ADPSGD) — the cost model of
``[sim]`` and ``[inject]`` (``pserver.sim.costs``), and the dump in ``run.out_dir`` with the
real run's schema and a ``simulated`` root attribute. What is simulated and what is refused:
:func:`check_supported` and docs/simulation.md.
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from pserver import __version__
from pserver.dump.writer import StatsWriter
from pserver.errors import ConfigError
from pserver.plan.config import Config, inject_plan, pull_timestamp
from pserver.plan.topology import tree_size
from pserver.protocols.partial_pull import PullRule
from pserver.runtime.outdir import check_out_dir
from pserver.runtime.rundir import DUMP_NAME, expand, point_latest, run_id
from pserver.sim.collective import HybridRun, SyncRun
from pserver.sim.cores import Cores, Serial
from pserver.sim.costs import Costs
from pserver.sim.gossip import GossipRun
from pserver.sim.learner import DataServer, SimLearner
from pserver.sim.local_steps import LocalStepsLearner
from pserver.sim.loop import make_loop
from pserver.sim.overlap import OverlapLearner, check_overlap
from pserver.sim.rows import Rows
from pserver.sim.servers import Servers, model_blocks
from pserver.sim.shard import SimShard
from pserver.sim.tree import TreeShard, plant, plant_bcast
from pserver.strategies import lookup

#: the learners-only strategies a simulation runs, by name: their run (pserver.sim.collective,
#: pserver.sim.gossip): ``Run(loop, cfg, costs, rows, λ, train_size)``, ``start``, ``end_rows``
LEARNERS_ONLY: dict[str, Any] = {"sync": SyncRun, "hybrid": HybridRun, "adpsgd": GossipRun}
#: the strategies a simulation runs (docs/simulation.md); the others are refused at start
SIMULATED = ("hardsync", "softsync", "async", "psp", "ssp", "bmuf", "ma", *LEARNERS_ONLY)
LOCAL_STEPS = ("bmuf", "ma")  # τ local steps per push (pserver.sim.local_steps)
MAX_LEARNERS = 100_000


@dataclass(frozen=True)
class Outcome:
    """What a simulation did, for the command's last line and the scale figures."""

    dump: Path
    sim_time: float  # simulated seconds
    wall: float  # real seconds the simulation took
    events: int
    updates: int
    peak_rss_mib: float


def check_supported(cfg: Config) -> int:
    """λ of a run the simulator can do; ``ConfigError`` naming what it cannot."""
    name = cfg.protocol.name
    if name not in SIMULATED:
        raise ConfigError(
            f"protocol.name = {name!r} is not simulated; pserver-sim runs "
            f"{', '.join(SIMULATED)} (docs/simulation.md)"
        )
    n = cfg.cluster.learners
    if not 1 <= n <= MAX_LEARNERS:
        raise ConfigError(
            f"cluster.learners = {n}: pserver-sim needs λ as cluster.learners, 1 to "
            f"{MAX_LEARNERS:,}"
        )
    if name in LEARNERS_ONLY:  # no shard: the real run's checks of λ and of [inject]
        least = lookup(name).min_learners
        if n < least:
            raise ConfigError(
                f"protocol.name = {name!r} needs at least {least} learners, this run has {n}: "
                "set cluster.learners"
            )
        inject_plan(cfg).validate(0, n)
        return n
    if cfg.blocks.split != "size":
        raise ConfigError('pserver-sim simulates blocks.split = "size": set it')
    check_one_block(cfg)
    check_overlap(cfg)
    inject_plan(cfg).validate(cfg.cluster.servers, n)  # a slow shard or learner that exists
    return n


def check_one_block(cfg: Config) -> None:
    """``ConfigError`` for the trees and the overlapped engines with several shards or blocks:
    they are simulated over one shard with one block only (pserver/sim/tree.py,
    pserver/sim/overlap.py)."""
    c = cfg.cluster
    uses = [f"cluster.{key} = {value}" for key, value in
            (("tree_fanout", c.tree_fanout), ("bcast_fanout", c.bcast_fanout)) if value]
    if cfg.comm.mode != "blocking":
        uses.append(f"comm.mode = {cfg.comm.mode!r}")
    if uses and (c.servers != 1 or cfg.blocks.count != 1):
        raise ConfigError(
            f"{', '.join(uses)}: pserver-sim simulates it with one shard and one block only, "
            f"this run has cluster.servers = {c.servers} and blocks.count = {cfg.blocks.count}: "
            "set both to 1"
        )


def model_bytes(cfg: Config) -> tuple[int, int]:
    """(bytes of the model, training samples per epoch), from the shapes alone: the dataset is
    described, never loaded (``learners.data.describe_dataset``)."""
    from learners.data import describe_dataset
    from learners.models import build_model

    ds = describe_dataset(cfg.data, cfg.run.seed)
    model = build_model(cfg.model, ds.n_features, ds.n_classes, np)
    return int(model.n_params) * np.dtype(model.dtype).itemsize, int(ds.n_train)


def simulate(cfg: Config, rid: str | None = None) -> Outcome:
    """Run the simulation ``cfg`` describes and write its dump; returns what it did."""
    started = time.perf_counter()
    n = check_supported(cfg)
    strategy = lookup(cfg.protocol.name)
    if strategy.protocol is not None:  # a protocol that cannot run with λ fails here
        strategy.protocol(cfg, n)
    costs_bytes, train_size = model_bytes(cfg)
    if strategy.protocol is not None:  # a blocks.count the real run refuses fails here
        model_blocks(cfg, costs_bytes)
    cfg.run.out_dir, latest = expand(cfg.run.out_dir, cfg.run.name, rid or run_id())
    dump = check_out_dir(cfg.run.out_dir, DUMP_NAME, cfg.run.overwrite)
    writer = StatsWriter(dump, root_attrs(cfg, n), flush_interval=3600.0)
    if latest is not None:
        point_latest(latest, dump.parent)
    with writer:
        rows = Rows(writer)
        loop = make_loop(cfg.sim.loop)
        costs = Costs.from_config(cfg, costs_bytes)
        if cfg.protocol.name in LEARNERS_ONLY:
            if cfg.sim.cores > 0:  # a fit of any dump sets it: say it does not apply here
                print(f"pserver-sim: sim.cores = {cfg.sim.cores:g} is not modelled for "
                      f"{cfg.protocol.name} (its learners each have a core)", file=sys.stderr)
            run = LEARNERS_ONLY[cfg.protocol.name](loop, cfg, costs, rows, n, train_size)
            loop.after(cfg.sim.start_time, run.start)
            loop.run()
            run.end_rows(loop.now)
            updates, shared = run.updates, {}
        else:
            updates, shared = run_shard(loop, cfg, costs, rows, n, train_size, costs_bytes)
        rows.close()
        wall = time.perf_counter() - started
        sim_time = loop.now + cfg.sim.end_time
        rss = peak_rss_mib()
        writer.set_attrs(
            "/",
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            wall_time=sim_time,
            **shared,
            simulated={"loop": cfg.sim.loop, "events": loop.events, "seconds": wall,
                       "peak_rss_mib": rss, "cost_model": asdict(cfg.sim)},
        )  # fmt: skip
    return Outcome(dump, sim_time, wall, loop.events, updates, rss)


def run_shard(loop: Any, cfg: Config, costs: Costs, rows: Rows, n: int, train_size: int,
              costs_bytes: int) -> tuple[int, dict[str, float]]:  # fmt: skip
    """The parameter-server strategies: ``cluster.servers`` shards, λ learners (and a tree's
    aggregators); the updates applied and, with ``sim.cores``, the statistics server's CPU for
    the dump's root."""
    tree = cfg.cluster.tree_fanout > 0  # the aggregator tree (pserver.sim.tree)
    shard = Servers(loop, cfg, costs, rows, n, train_size, TreeShard if tree else SimShard)
    data = DataServer(cfg.sim.data_time)
    rule, waits = pull_timestamp(cfg), lookup(cfg.protocol.name).waits_for_update
    p = cfg.protocol
    kind, extra = SimLearner, {}
    if p.name in LOCAL_STEPS:
        kind, extra = LocalStepsLearner, {"tau": p.tau}
    elif cfg.comm.mode != "blocking":  # the overlapped engines (pserver.sim.overlap)
        kind, extra = OverlapLearner, {"max_inflight": cfg.comm.max_inflight}
    shard.learners = [
        kind(k, loop, costs, rows, shard, data, PullRule(rule, waits), p.pull_fraction, p.tau2,
             **extra)
        for k in range(n)
    ]  # fmt: skip
    learners = list(shard.learners)
    starts = [learner.start for learner in learners]
    if tree:  # the shard answers the top aggregators as λ + their index
        aggs = plant(cfg, loop, costs, rows, shard.shards[0], learners)
        shard.learners = [*learners, *aggs]
        starts += [a.start for a in aggs]
    if cfg.cluster.bcast_fanout:  # the learners' broadcast tree (overlapped learners)
        plant_bcast(cfg, costs, learners)
    cores = share_cores(loop, cfg, shard)
    for start in starts:
        loop.after(cfg.sim.start_time, start)
    loop.run()
    shard.end_rows()
    shared = {} if cores is None else {"stats_cpu_time": cfg.sim.other_cpu * rows_of(shard)}
    return shard.updates, shared


def share_cores(loop: Any, cfg: Config, shard: Servers) -> Cores | None:
    """With ``sim.cores`` > 0: one processor-sharing queue (``pserver.sim.cores``) that every
    learner, the shards and the statistics server run their CPU on; None (no cost) without."""
    if cfg.sim.cores <= 0.0:
        return None
    cores = Cores(loop, cfg.sim.cores)
    stats = Serial(cores) if cfg.sim.other_cpu > 0.0 else None
    shard.cores = cores
    for learner in shard.learners:
        learner.cores, learner.stats = cores, stats
    return cores


def rows_of(shard: Servers) -> int:
    """The ``train`` rows the learners wrote (one per minibatch)."""
    return sum(learner.steps for learner in shard.learners)


def root_attrs(cfg: Config, n: int) -> dict[str, Any]:
    """The root attributes a real run's statistics server writes that mean something here."""
    world = cfg.cluster.servers + 2 + n + tree_size(n, cfg.cluster.tree_fanout)
    return {
        "config": cfg.to_dict(),
        "protocol": cfg.protocol.name,
        "n_learners": n,
        "n_servers": cfg.cluster.servers,
        "world_size": world,
        "pserver_version": __version__,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        # the cores its ranks shared; without sim.cores each rank had its own
        "cores": int(round(cfg.sim.cores)) if cfg.sim.cores > 0 else world,
        "run_dir": cfg.run.out_dir,
        "simulated": json.dumps({"loop": cfg.sim.loop}),
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
