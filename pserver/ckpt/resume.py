"""What a checkpoint supports, and ``--resume RUN_DIR``: read and check it before training.

Checkpoints cover the flat parameter-server family (hardsync, n-softsync, async, SSP, PSP; one
or more shards, ``comm.mode`` blocking, thread or nonblocking, messages or shm transport: what
lives in the shared window and why none of it needs saving, ``pserver.ckpt.drivers.shm``) with or
without PP-ASGD's prediction layer (``protocol.predict``: the shards save their predictors,
``pserver.ckpt.records.prediction``), the lockstep strategies of the collective family (SYNC,
HYBRID:
``pserver.ckpt.drivers.lockstep``, ``pserver.ckpt.drivers.draws``), its gossip strategy ADPSGD
(the learners save their models, optimizer state and clocks, ``pserver.ckpt.drivers.gossip``)
and the model-averaging family (BMUF, MA: the shards' W and Δ, learners stopped at a block's
start; either transport); the parameter-server family also with Rudra-adv's aggregator tree
and the learner broadcast tree (``pserver.roles.aggregator``, ``pserver.roles.bcast``: the
cut drains them, the fan-outs must not change on resume), and with partial pulling and the
iteration rule (``protocol.pull_fraction < 1``, ``protocol.pull_timestamp = "iteration"``:
``pserver.ckpt.records.partial_pull``). Lockstep and block learners stop on a signal at one boundary
they agree on (``pserver.roles.stop_vote``); ADPSGD's free-running learners each stop at their
own step boundary and complete their exchanges with goodbyes. A strategy of a new family is
refused by :func:`unsupported`'s one line when a checkpoint is asked for (``--resume``), and
such a run ends a SIGTERM at once, without a checkpoint (the signal's default action), until
its roles have ``state()`` / ``restore()`` (see ``pserver.ckpt.drivers.end``) and its registry
descriptor says ``checkpoints=True``; what its learner saves follows from its exchange
(:data:`LEARNER_RECORDS`).

:func:`open_resume` runs inside ``prepare`` on every rank, so any problem (no checkpoint, a
corrupt or truncated file, another rank count, a config that changed a key outside
``checkpoint.MAY_CHANGE``, arrays of other shapes or dtypes) is one ``pserver-run: error:``
line and exit status 2 through the start-up agreement (``pserver.runtime.startup``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pserver.ckpt.files import (
    CheckpointError,
    Manifest,
    State,
    attr,
    check_compatible,
    counts,
    expect,
    latest,
    rank_file,
)
from pserver.ckpt.records.gossip import check_learner
from pserver.ckpt.records.partial_pull import check_learner as check_copies
from pserver.ckpt.records.partial_pull import keeps_copies
from pserver.ckpt.records.pipeline import check_pipeline
from pserver.ckpt.records.prediction import check_predictor
from pserver.ckpt.records.quota import check_quota
from pserver.ckpt.records.shard import BlockRecord
from pserver.plan.config import Config
from pserver.strategies import lookup, names
from pserver.strategies.base import LOCAL_STEPS, PS, PS_OVERLAP
from pserver.strategies.collective import ALLREDUCE, ALLREDUCE_DELAYED, GOSSIP
from pserver.strategies.serving import serving

if TYPE_CHECKING:
    from learners.contract import Model
    from learners.data import Dataset
    from pserver.plan.topology import Block, Layout, Role


class RankPlan(Protocol):
    """What the checks of a resumed rank's state read of its plan
    (``pserver.runtime.context.Plan`` is one)."""

    @property
    def cfg(self) -> Config: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def rank(self) -> int: ...
    @property
    def model(self) -> Model: ...
    @property
    def dataset(self) -> Dataset: ...
    @property
    def blocks(self) -> tuple[Block, ...]: ...
    @property
    def role(self) -> Role: ...
    @property
    def dump_path(self) -> Path: ...
    @property
    def train_size(self) -> int: ...
    def blocks_of(self, shard: int) -> list[Block]: ...


CKPT_DIR = "checkpoint"


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / CKPT_DIR


def unsupported(cfg: Config) -> str | None:
    """Why this config cannot be checkpointed (None when it can): its strategy's descriptor
    says (``Strategy.checkpoints``)."""
    strategy = lookup(cfg.protocol.name)
    if not strategy.checkpoints:
        return f"protocol.name = {cfg.protocol.name!r} ({strategy.family} family)"
    return None


def refuse_unsupported(cfg: Config, what: str) -> None:
    why = unsupported(cfg)
    if why is not None:
        covered = ", ".join(n for n in names() if lookup(n).checkpoints)
        raise CheckpointError(
            f"{what}: checkpoints are not supported with {why}; they cover {covered}, with "
            "every transport, tree and layer of theirs (docs/checkpoints.md)"
        )


def refuse_periodic(cfg: Config) -> None:
    """``run.checkpoint_interval > 0``: refused as ``--resume`` is, and for a strategy whose
    learners cannot pause together (``Strategy.pauses``)."""
    what = f"run.checkpoint_interval = {cfg.run.checkpoint_interval}"
    refuse_unsupported(cfg, what)
    if cfg.cluster.tree_fanout > 0 and cfg.comm.mode != "blocking":
        # a known defect, refused rather than left to hang: after a part's in-place resume the
        # shard's round waits for ever although every aggregator relayed its children's
        # gradients (hardsync, 9 ranks, comm.mode nonblocking or thread, 0.3 s parts)
        raise CheckpointError(
            f"{what}: periodic checkpoints with an aggregator tree (cluster.tree_fanout = "
            f"{cfg.cluster.tree_fanout}) and comm.mode = {cfg.comm.mode!r} are not supported: "
            "a part resumed in place can wait for ever (a known defect); use comm.mode = "
            '"blocking", or checkpoint at the end and on SIGTERM only (docs/checkpoints.md)'
        )
    strategy = lookup(cfg.protocol.name)
    if not strategy.pauses:
        raise CheckpointError(
            f"{what}: periodic checkpoints are not supported with protocol.name = "
            f"{cfg.protocol.name!r} ({strategy.why_no_pause}); it checkpoints "
            "at its end and on SIGTERM (docs/checkpoints.md)"
        )


TREES = {"tree_fanout": "aggregator tree", "bcast_fanout": "learner broadcast tree"}


def check_trees(saved: dict[str, Any], cfg: Config, run_dir: str) -> None:
    """The trees' fan-outs place the ranks (``pserver.plan.topology``): a resumed run keeps them.
    Checked before the rank count, which a changed aggregator tree changes too."""
    for key, tree in TREES.items():
        old, now = saved.get("cluster", {}).get(key, 0), getattr(cfg.cluster, key)
        if old != now:
            raise CheckpointError(
                f"--resume {run_dir}: the checkpoint was written with cluster.{key} = {old} "
                f"({tree}), this run has {now}: the rank layout would change; resume with "
                f"cluster.{key}={old}"
            )


@dataclass(frozen=True)
class Resume:
    """The checkpoint a rank resumes from: the manifest and its own state."""

    run_dir: Path
    manifest: Manifest
    state: State
    # a periodic checkpoint's own run going on in process (pserver.ckpt.drivers.periodic): the
    # same job, so no restart is counted
    continued: bool = False

    @property
    def restarts(self) -> int:
        return int(self.manifest.extra.get("restarts", 0)) + (0 if self.continued else 1)

    @property
    def elapsed(self) -> float:
        return float(self.manifest.extra.get("elapsed", 0.0))


#: what a refused config says when it came from a CONFIG file given beside ``--resume``
OMIT_CONFIG = (
    "; or leave CONFIG out: `pserver-run --resume RUN_DIR [key=value ...]` takes the "
    "checkpointed run's own config, overrides included"
)


def open_resume(
    run_dir: str, cfg: Config, world_size: int, rank: int, role: str, from_file: bool = True
) -> Resume:
    """Read and check this rank's part of the checkpoint in ``run_dir`` (every rank);
    ``from_file``: ``cfg`` was loaded from a CONFIG file (else from the checkpoint itself)."""
    refuse_unsupported(cfg, f"--resume {run_dir}")
    ckpt = checkpoint_dir(run_dir)
    manifest = latest(ckpt)
    if manifest is None:
        raise CheckpointError(
            f"--resume {run_dir}: no checkpoint there ({ckpt / 'LATEST'} does not exist)"
        )
    check_trees(manifest.config, cfg, run_dir)
    if manifest.world_size != world_size:
        raise CheckpointError(
            f"--resume {run_dir}: the checkpoint was written by {manifest.world_size} ranks, "
            f"this job has {world_size}: launch it with mpiexec -n {manifest.world_size}"
        )
    check_compatible(manifest.config, cfg.to_dict(), OMIT_CONFIG if from_file else "")
    check_epochs(manifest, cfg, run_dir)
    path = rank_file(ckpt, manifest.generation, rank)
    if not path.exists():
        raise CheckpointError(f"--resume {run_dir}: {path} is missing")
    from pserver.ckpt.files import read_state

    state = read_state(path, manifest.sha256.get(rank))
    saved_role = state.attrs.get("role")
    if saved_role != role:
        raise CheckpointError(
            f"--resume {run_dir}: rank {rank} was a {saved_role} in the checkpointed run, "
            f"it is a {role} now: the rank layout changed"
        )
    return Resume(Path(run_dir), manifest, state)


def check_out_dir(run_dir: str, out_dirs: list[str]) -> None:
    """``--resume RUN_DIR`` continues the dump in RUN_DIR: a ``run.out_dir`` override naming
    another directory (``out_dirs``: the overrides' values, expanded) would be silently
    replaced by it, so it is refused (issue 22, D10); one naming RUN_DIR itself is what
    ``--resume`` sets anyway (``scripts/pserver.slurm`` passes it)."""
    for out in out_dirs:
        if Path(out).resolve() != Path(run_dir).resolve():
            raise CheckpointError(
                f"--resume {run_dir}: run.out_dir = {out!r}: a resumed run continues in its "
                "own directory; drop the run.out_dir override (copy the run directory to "
                "resume elsewhere)"
            )


def epochs_done(manifest: Manifest) -> int:
    """The epochs the checkpointed run completed: recorded at the commit
    (``pserver.ckpt.drivers.end``); for an older checkpoint of a run that ended well, its
    ``run.epochs``, else 0 (unknown, nothing refused)."""
    done = manifest.extra.get("epochs_done")
    if isinstance(done, int) and not isinstance(done, bool) and done >= 0:
        return done
    if manifest.extra.get("stopped") or manifest.extra.get("periodic"):
        return 0
    epochs = manifest.config.get("run", {}).get("epochs", 0)
    return epochs if isinstance(epochs, int) else 0


def check_epochs(manifest: Manifest, cfg: Config, run_dir: str) -> None:
    """Refuse ``run.epochs`` at or below the epochs already done: that part would train
    nothing and only rewrite the checkpoint (issue 22, D10)."""
    done = epochs_done(manifest)
    if cfg.run.epochs <= done:
        raise CheckpointError(
            f"--resume {run_dir}: run.epochs = {cfg.run.epochs}, but the checkpointed run has "
            f"done {done} epochs; set run.epochs above {done} to train on"
        )


def data_fingerprint(X: Any, y: Any) -> str:
    """SHA-256 of the training set (shapes, dtypes and bytes of features and labels): a
    resumed run must train on the very data its checkpoint's sampler indexes."""
    import hashlib

    h = hashlib.sha256()
    for a in (X, y):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def check_data(state: State, X: Any, y: Any, where: str) -> None:
    """The data server's saved fingerprint (absent in older checkpoints) against this run's."""
    saved = state.attrs.get("data_sha256")
    if saved is None:
        return
    if saved != data_fingerprint(X, y):
        raise CheckpointError(
            f"{where}: the training data differ from those the checkpoint was written with "
            "(SHA-256 of the training arrays): resume with the same data.* and data file"
        )


def check_attrs(plan: RankPlan, state: State, where: str) -> None:
    """The JSON attributes each role's ``restore()`` reads back, checked for type and range
    before training (issue 22, D4): a restore runs after the start-up agreement, where a bad
    value would crash one rank or, like ``dump_rows`` = 0, silently cut the dump."""
    from pserver.plan.topology import Role

    a, role = state.attrs, plan.role
    if role is Role.STATS:  # pserver.roles.statserver.StatsServer.restore
        counts(a, "dump_rows", where)
        counts(a, "tested", where)
        counts(a, "skipped", where)
        sigma = attr(a, "sigma", list, where)
        if len(sigma) != 3:
            raise CheckpointError(f"{where}: the checkpoint's 'sigma' is {sigma!r}, expected 3")
        for i, v in enumerate(sigma):
            attr({f"sigma[{i}]": v}, f"sigma[{i}]", float, where, 0)
        attr(a, "elapsed", float, where, 0)
    elif role is Role.SERVER:  # pserver.ckpt.records.shard.restore_block
        for b in plan.blocks_of(plan.layout.index(plan.rank)):
            block = attr(attr(a, "blocks", dict, where), str(b.index), dict, where)
            for name in ("ts", "applied", "dropped", "next_epoch"):
                attr(block, name, int, f"{where} block {b.index}", 0)
    elif role is Role.DATA:  # learners.data.BatchSampler.restore, pserver.ckpt.drivers.draws
        sampler = attr(a, "sampler", dict, where)
        for name in ("n", "batch_size"):
            attr(sampler, name, int, where, 1)
        attr(sampler, "pos", int, where, 0, sampler["n"])
        attr(sampler, "served", int, where, 0)
        attr(sampler, "rng", dict, where)
        if "lockstep_steps" in a:
            attr(a, "lockstep_steps", int, where, 0)
        if "quota" in a:  # the learners-only strategies' (pserver.ckpt.records.quota)
            check_quota(a, where)
    elif role is Role.LEARNER:  # pserver.roles.trainer.Trainer.restore and its exchange's
        if "steps" in a:
            attr(a, "steps", int, where, 0)
        ex = attr(a, "exchange", dict, where) if "exchange" in a else {}
        for name in ("version", "next_epoch", "k", "exchanged"):
            if name in ex:  # lockstep (version, next_epoch), gossip (k, exchanged, next_epoch)
                attr(ex, name, int, where, 0)
        if "clock" in ex:
            counts(ex, "clock", where)
    elif role is Role.AGGREGATOR and "children" in a:  # compared with this run's in check_state
        counts(a, "children", where)


def check_state(plan: RankPlan, resume: Resume) -> None:
    """Refuse, before training, a rank state (``resume``'s) that does not fit this run's model
    and data (``plan``'s)."""
    from pserver.optim.rules import make_updater
    from pserver.plan.topology import Role

    state, where = resume.state, f"--resume {resume.run_dir} (rank {plan.rank})"
    role = plan.role
    check_attrs(plan, state, where)
    if role is Role.SERVER:
        dtype = np.dtype(plan.model.dtype)
        names = make_updater(plan.cfg.optim, 1, np, dtype).state_arrays()
        if lookup(plan.cfg.protocol.name).shard_block:  # BMUF's master keeps Δ, no optimizer
            names = {"delta": None}
        for b in plan.blocks_of(plan.layout.index(plan.rank)):
            expect(state, f"w{b.index}", (b.size,), dtype, where)
            for name in names:
                expect(state, f"opt{b.index}.{name}", (b.size,), dtype, where)
            if str(b.index) not in state.attrs.get("blocks", {}):
                raise CheckpointError(f"{where}: the checkpoint lacks block {b.index}'s state")
            predicts = serving(plan.cfg).predicts
            if predicts:  # PP-ASGD's predictor (pserver.ckpt.records.prediction)
                check_predictor(plan.cfg, state, b, where)
            # the block's record as its restore reads it (rounds, counters, predictor)
            saved = State(state.arrays, state.attrs["blocks"][str(b.index)])
            probed = predicts and bool(plan.cfg.protocol.predict_probe)
            BlockRecord.from_state(saved, b.index, list(names), predicts, probed, where)
    elif role is Role.DATA:
        sampler = state.attrs.get("sampler", {})
        batch, n = plan.cfg.data.batch_size, plan.train_size
        if (sampler.get("n"), sampler.get("batch_size")) != (n, batch):
            raise CheckpointError(
                f"{where}: the data stream was of {sampler.get('n')} samples in batches of "
                f"{sampler.get('batch_size')}, this run has {n} in batches of {batch}"
            )
        check_data(state, plan.dataset.X_train, plan.dataset.y_train, where)
        replay = state.arrays.get("replay")
        if replay is None or replay.ndim != 2 or replay.shape[1] != batch:
            raise CheckpointError(f"{where}: the replayed minibatches are missing or malformed")
    elif role is Role.LEARNER:  # what its exchange saves (LEARNER_RECORDS)
        exchange = lookup(plan.cfg.protocol.name).exchange(plan.cfg.comm.mode)
        LEARNER_RECORDS[exchange](plan, state, where)
    elif role is Role.AGGREGATOR:  # the tree placed by node (pserver.plan.topology.tree_layout)
        saved = state.attrs.get("children")
        now = sorted(plan.layout.children(plan.rank))
        if saved is not None and list(saved) != now:
            raise CheckpointError(
                f"{where}: this aggregator's children were ranks {list(saved)}, they are {now} "
                "now: the aggregator tree was laid out on other nodes; resume on the same hosts"
            )
    elif role is Role.STATS and not plan.dump_path.is_file():
        raise CheckpointError(f"{where}: the dump {plan.dump_path} to continue is missing")


# -- the learner's own record, by its exchange (``Strategy.exchanges``) ----------------------


def _no_record(plan: RankPlan, state: State, where: str) -> None:
    """BMUF's and MA's learners start every block from the shards' model: nothing of theirs."""


def _ps_copies(plan: RankPlan, state: State, where: str) -> None:
    """Partial pulling keeps the learner's copies and iteration tag
    (``pserver.ckpt.records.partial_pull``); a plain PS learner keeps nothing."""
    if keeps_copies(plan.cfg):
        blocks = [b.index for b in plan.blocks]
        check_copies(state, plan.model.n_params, np_dtype(plan), blocks, where)


def _ps_pipeline(plan: RankPlan, state: State, where: str) -> None:
    """The overlapped learner's pipeline (``pserver.ckpt.records.pipeline``)."""
    blocks = [b.index for b in plan.blocks]
    check_pipeline(state, plan.model.n_params, np_dtype(plan), blocks, where)


def _lockstep_model(plan: RankPlan, state: State, where: str, extra: tuple[str, ...] = ()) -> None:
    """SYNC's learner: its model and optimizer state (``pserver.ckpt.drivers.lockstep``)."""
    dtype = np_dtype(plan)
    for name in ["w", *(f"opt.{k}" for k in rule_arrays(plan)), *extra]:
        expect(state, f"exchange.{name}", (plan.model.n_params,), dtype, where)


def _lockstep_delayed(plan: RankPlan, state: State, where: str) -> None:
    """HYBRID's: SYNC's, and the model before the last landing (``pre``)."""
    _lockstep_model(plan, state, where, ("pre",))


def _gossip(plan: RankPlan, state: State, where: str) -> None:
    """ADPSGD's learner: model, optimizer state, clocks (``pserver.ckpt.records.gossip``)."""
    check_learner(state, plan.model.n_params, np_dtype(plan), rule_arrays(plan),
                  len(plan.layout.learners), where)  # fmt: skip


def np_dtype(plan: RankPlan) -> np.dtype:
    return np.dtype(plan.model.dtype)


def rule_arrays(plan: RankPlan) -> list[str]:
    """The names of the update rule's state arrays (momentum's velocity, …) for this run."""
    from pserver.optim.rules import make_updater

    return list(make_updater(plan.cfg.optim, 1, np, np_dtype(plan)).state_arrays())


#: learner exchange -> the check of the record it saves: a strategy with one of these exchanges
#: needs no entry of its own here (a new exchange adds its record's check)
LEARNER_RECORDS: dict[str, Callable[[RankPlan, State, str], None]] = {
    PS: _ps_copies,
    PS_OVERLAP: _ps_pipeline,
    LOCAL_STEPS: _no_record,
    ALLREDUCE: _lockstep_model,
    ALLREDUCE_DELAYED: _lockstep_delayed,
    GOSSIP: _gossip,
}
