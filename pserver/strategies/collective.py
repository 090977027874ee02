"""The collective/gossip family (IBM, Zhang et al., §3): learners only, no parameter server.

SYNC, HYBRID and ADPSGD keep the model on every learner and exchange gradients or weights
among the learners (``pserver.comm.collectives``); the data server ends the run and the
statistics server tests the learners' average model (``pserver.protocols.lockstep``). Their ranks
are
learners + the statistics server + the data server: ``cluster.servers`` must be 0 (0 when not
given), and the keys that configure shards, trees or their transport mean nothing here, so one
typed on the command line is refused (:func:`check_learners_only`) and one of the config file is
reset to its default and listed at start (``pserver.plan.config.set_aside_shard_keys``).
"""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.strategies.base import Config, Param, Ranks, Strategy

#: The family's learner exchanges, by name (resolved to classes by ``pserver.job.cli``).
ALLREDUCE = "allreduce"  # SYNC: sum the gradients, apply the average, every step
ALLREDUCE_DELAYED = "allreduce-delayed"  # HYBRID: the same, one step late (in the comm engine)

GOSSIP = "gossip"  # ADPSGD: average with a ring neighbour, in a communication thread

#: Exchanges that always run a communication thread (MPI_THREAD_MULTIPLE, whatever comm.mode).
THREADED = frozenset({ALLREDUCE_DELAYED, GOSSIP})

RANKS = Ranks(servers=False)

#: Keys shared by the lockstep strategies (SYNC, HYBRID). Their rate is α0 (IBM Fig. 3a: the
#: average of the learners' local steps; ``pserver.optim.local_update``); ``lr_policy`` is accepted
#: as "auto" or "none" so that a parameter-server config switches by ``protocol.name`` alone.
LOCKSTEP_SHARED = (Param("lr_policy", str, "auto", help="learning-rate modulation by staleness"),)

#: Keys that configure shards, aggregator or broadcast trees, or the shard transport.
SHARD_KEYS = (
    "cluster.tree_fanout", "cluster.bcast_fanout", "comm.versions", "comm.max_inflight",
    "blocks.count", "blocks.split", "run.epoch_basis", "inject.slow_server",
    "inject.server_factor", "inject.pull_delay_prob", "inject.pull_delay",
)  # fmt: skip


def check_learners_only(s: Strategy, cfg: Config) -> None:
    """A shard-only key typed on the command line, or the shared-memory transport of the
    shards: refused (the file's are set aside: ``pserver.plan.config.set_aside_shard_keys``)."""
    for key in SHARD_KEYS:
        if key in cfg.overridden:
            raise ConfigError(
                f"{key} configures parameter-server shards or their trees; protocol.name = "
                f"{s.name!r} runs learners only (no shard): remove it"
            )
    if cfg.comm.transport != "messages":
        raise ConfigError(
            f'comm.transport = {cfg.comm.transport!r} shares shard windows; protocol.name = '
            f'{s.name!r} runs learners only: use comm.transport = "messages"'
        )


def check_mode(s: Strategy, cfg: Config) -> None:
    """A ``comm.mode`` the strategy has no exchange for is refused before training."""
    s.exchange(cfg.comm.mode)


def check_lockstep_lr_policy(s: Strategy, cfg: Config) -> None:
    """A lockstep step averages gradients of one age: no staleness to modulate by."""
    policy = cfg.protocol.lr_policy
    if policy not in ("auto", "none"):
        raise ConfigError(
            f"protocol.lr_policy = {policy!r} does not apply to {s.name} (every step averages "
            'the gradients of one model); use "auto" or "none"'
        )


#: Checks of every learners-only strategy.
CHECKS = (check_mode, check_learners_only)
