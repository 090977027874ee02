"""The schema of the statistics dump (``stats.h5``), defined once: one typed record per group.

Each group of the dump is a table: one row per event (an update, a gradient, a minibatch, a
test) or per rank at the end of the run. Its record below is a frozen dataclass whose fields
are the group's columns, in order, each with its HDF5 dtype and meaning
(``field(metadata=...)`` through :func:`col`). The statistics writer creates every column of
a group with this dtype and refuses a column the schema does not have
(:func:`pserver.dump.writer.StatsWriter.append`); ``tests/test_stats_schema.py`` checks
``docs/stats.md`` against :data:`GROUPS` and :data:`ROOT_ATTRS`, so the page and the files
cannot drift apart.

Role-neutral where it can be: the column names are those of the dumps already written (the
readers and plots use them), but an update's owner (``shard``) is whatever holds the weights —
a server shard today, a learner in the learners-only strategies — and a learner index is an
index among the learners whatever the strategy.

Pure: no MPI, no h5py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DTYPES = ("int32", "int64", "float64")


def col(dtype: str, meaning: str) -> Any:
    """A column of a record: its dtype (one of ``DTYPES``) and what it means."""
    assert dtype in DTYPES, dtype
    return field(metadata={"dtype": dtype, "meaning": meaning})


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    meaning: str


@dataclass(frozen=True)
class Group:
    """One group of the dump: ``name/<column>`` 1-D datasets, all of the same length, and
    ``clocks``: 2-D int64 datasets of ragged rows padded with -1 (row-aligned)."""

    name: str
    rows: str  # what one row is
    record: type
    clocks: tuple[Column, ...] = ()

    @property
    def columns(self) -> tuple[Column, ...]:
        return tuple(
            Column(f.name, f.metadata["dtype"], f.metadata["meaning"])
            for f in dataclasses.fields(self.record)
        )

    def dtype(self, column: str) -> np.dtype:
        for c in self.columns:
            if c.name == column:
                return np.dtype(c.dtype)
        raise KeyError(column)


# -- the records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    shard: int = col("int32", "owner of the weights updated (a server shard)")
    timestamp: int = col("int64", "the weights' new timestamp i after this update")
    time: float = col("float64", "s since start")
    n_gradients: int = col("int32", "gradients aggregated into this update")
    mean_staleness: float = col("float64", "Rudra eq. (2): (i - 1) - mean(i_1 .. i_n)")
    lr: float = col("float64", "effective learning rate used")


@dataclass(frozen=True)
class Gradient:
    shard: int = col("int32", "owner that received it")
    learner: int = col("int32", "learner index that computed it")
    timestamp: int = col("int64", "timestamp of the weights it was computed from")
    staleness: int = col("int32", "owner's timestamp when applied - timestamp")
    update: int = col("int64", "timestamp of the update it entered; -1 if dropped")
    time: float = col("float64", "s since start (arrival)")


@dataclass(frozen=True)
class Staleness:
    """Issue 25: σ of one applied contribution, the same measure for every strategy
    (docs/stats.md, *Staleness σ*)."""

    learner: int = col("int32", "learner index that computed the contribution")
    owner: int = col("int32", "holder of the weights it was applied to: shard, or learner")
    version: int = col("int64", "version of the owner's weights it was computed from")
    staleness: int = col("int32", "σ: updates applied to those weights between version and use")
    time: float = col("float64", "s since start (when recorded)")


@dataclass(frozen=True)
class Train:
    learner: int = col("int32", "learner index")
    step: int = col("int64", "the learner's minibatch counter")
    time: float = col("float64", "s since start")
    loss: float = col("float64", "training loss of the minibatch")
    error: float = col("float64", "training error of the minibatch")
    compute_time: float = col("float64", "s computing the gradient")
    wait_time: float = col("float64", "s blocked before this step")
    pull_time: float = col("float64", "of which waiting for weights")
    push_time: float = col("float64", "of which waiting for the previous push")
    stale_fraction: float = col("float64", "share of blocks computed on an older copy")
    dropped_blocks: int = col("int32", "replies dropped as too old before this step")


@dataclass(frozen=True)
class Test:
    epoch: float = col("float64", "epochs of training data processed")
    time: float = col("float64", "s since start")
    samples: int = col("int64", "training samples processed so far")
    timestamp: int = col("int64", "timestamp of the weights tested")
    loss: float = col("float64", "test loss")
    error: float = col("float64", "test error")


@dataclass(frozen=True)
class SkippedTest:
    epoch: float = col("float64", "the epoch due a test")
    time: float = col("float64", "s since start when given up")
    blocks_received: int = col("int32", "blocks of its snapshot that arrived")


@dataclass(frozen=True)
class LearnerTotals:
    learner: int = col("int32", "learner index")
    minibatches: int = col("int64", "minibatches computed")
    compute_time: float = col("float64", "total s computing")
    wait_time: float = col("float64", "total s blocked")
    samples: int = col("int64", "training samples processed")
    pull_time: float = col("float64", "total s blocked on pulls")
    push_time: float = col("float64", "total s blocked on push delivery")
    overlap: float = col("float64", "Rudra Table I: compute / (compute + pull + push)")
    relayed_bytes: int = col("int64", "bytes forwarded to broadcast-tree children")
    cpu_time: float = col("float64", "CPU s of the process")
    run_time: float = col("float64", "wall s over the same span")


@dataclass(frozen=True)
class ServerTotals:
    shard: int = col("int32", "shard index")
    updates: int = col("int64", "updates applied")
    dropped_after_stop: int = col("int64", "gradients drained after the stop")
    wait_time: float = col("float64", "total s waiting for messages")
    bytes_in: int = col("int64", "payload bytes received")
    bytes_out: int = col("int64", "payload bytes sent")
    skipped_snapshots: int = col("int32", "epoch snapshots not sent (queue full)")
    cpu_time: float = col("float64", "CPU s of the process")
    run_time: float = col("float64", "wall s over the same span")


@dataclass(frozen=True)
class BlockTotals:
    block: int = col("int32", "block index")
    shard: int = col("int32", "its owner")
    timestamp: int = col("int64", "the block's final timestamp")
    applied: int = col("int64", "gradients applied to it")
    dropped: int = col("int64", "gradients its protocol dropped")
    size: int = col("int64", "parameters in the block")


@dataclass(frozen=True)
class AggregatorTotals:
    aggregator: int = col("int32", "aggregator index")
    rank: int = col("int32", "its MPI rank")
    bytes_in: int = col("int64", "payload bytes received")
    bytes_out: int = col("int64", "payload bytes sent")
    wait_time: float = col("float64", "total s waiting for messages")
    cpu_time: float = col("float64", "CPU s of the process")
    run_time: float = col("float64", "wall s over the same span")


@dataclass(frozen=True)
class Delay:
    shard: int = col("int32", "owner whose reply was held")
    learner: int = col("int32", "learner it was for")
    block: int = col("int32", "block of the reply")
    request: int = col("int64", "the learner's pull counter at that owner")
    time: float = col("float64", "s since start when the reply was due")
    delay: float = col("float64", "s it was held")


@dataclass(frozen=True)
class Prediction:
    shard: int = col("int32", "owner of the weights (PP-ASGD, protocol.predict)")
    timestamp: int = col("int64", "the update's new timestamp t")
    steps: int = col("int32", "S: pulls of w_t are answered with f_S(w_t, M_t)")
    staleness_mean: float = col("float64", "S̄: running mean of recent updates' ⟨σ⟩")


@dataclass(frozen=True)
class PredictionError:
    shard: int = col("int32", "owner of the block")
    block: int = col("int32", "block index")
    origin: int = col("int64", "timestamp t of the prediction f_S(w_t, M_t)")
    steps: int = col("int32", "S it was served with")
    horizon: int = col("int64", "H = S + 1: compared with w_{t+H}")
    dd: float = col("float64", "d·d, d = w_{t+H} - w_t (block)")
    dm: float = col("float64", "d·M_t (block)")
    mm: float = col("float64", "M_t·M_t (block)")
    error: float = col("float64", "‖w_{t+H} - f_S(w_t, M_t)‖ of the block")
    momentum: float = col("float64", "μ (the error for any S': d·d - 2a·d·M + a²·M·M)")
    time: float = col("float64", "s since start (at t + H)")


@dataclass(frozen=True)
class Exchange:
    """Issue 12: one row per step of a learners-only learner (SYNC, HYBRID, ADPSGD)."""

    learner: int = col("int32", "learner index")
    step: int = col("int64", "the learner's step whose gradient or model was exchanged")
    partner: int = col("int32", "learner exchanged with; -1: all (an allreduce)")
    partner_age: int = col("int32", "ADPSGD: steps the partner's model is behind ours; else -1")
    partner_step: int = col("int64", "the partner's step count (ADPSGD's vector clock); -1: none")
    bytes: int = col(
        "int64", "bytes of the array exchanged (an allreduce's buffer; ADPSGD: the model sent)"
    )
    wait_time: float = col("float64", "s blocked on the exchange in this step")
    time: float = col("float64", "s since start")


@dataclass(frozen=True)
class Drift:
    """Issue 12: how far the learners' models are apart, once per epoch (learners-only)."""

    epoch: int = col("int32", "the epoch that ended")
    time: float = col("float64", "s since start")
    max_diff: float = col("float64", "largest |w_i - w_0| over learners i and parameters")
    learner: int = col("int32", "the learner i it was found on (0 when all are equal)")


@dataclass(frozen=True)
class Round:
    shard: int = col("int32", "server shard (BMUF's master) that updated")
    block: int = col("int32", "parameter block")
    round: int = col("int64", "block index t: the block's timestamp after this update")
    time: float = col("float64", "s since start")
    tau: int = col("int32", "local steps per learner per block")
    eta: float = col("float64", "block momentum η (Chen & Huo eq. 3)")
    zeta: float = col("float64", "block learning rate ζ (eq. 3)")
    g_norm: float = col("float64", "‖G(t)‖ of this block: mean local model - W_g(t-1) (eq. 2)")
    delta_norm: float = col("float64", "‖Δ(t)‖ of this block (eq. 3)")
    learners: int = col("int32", "local models averaged into W̄(t)")
    local_steps: int = col("int64", "the learners' local steps in this block, summed")


@dataclass(frozen=True)
class LearnerLost:
    """Issue 22: a learner that died while the run went on (Open MPI's ULFM)."""

    learner: int = col("int32", "learner index")
    rank: int = col("int32", "its MPI rank")
    time: float = col("float64", "s since start when the statistics server saw it lost")
    last_step: int = col("int64", "its last step the dump knows of: train row or push (-1: none)")
    learners: int = col("int32", "λ after the loss: the learners still training")


VECTOR_CLOCK = Column("vector_clock", "int64", "timestamps of the aggregated gradients")

GROUPS: dict[str, Group] = {
    g.name: g
    for g in (
        Group("updates", "one per weight update", Update, (VECTOR_CLOCK,)),
        Group("gradients", "one per gradient received", Gradient),
        Group("staleness", "one per applied contribution, every strategy", Staleness),
        Group("train", "one per learner minibatch", Train),
        Group("test", "one per model test", Test),
        Group("skipped_tests", "one per epoch due a test that got none", SkippedTest),
        Group("learners", "one per learner, at the end", LearnerTotals),
        Group("servers", "one per server shard, at the end", ServerTotals),
        Group("blocks", "one per parameter block, at the end", BlockTotals),
        Group("aggregators", "one per aggregator, at the end", AggregatorTotals),
        Group("delays", "one per injected pull delay", Delay),
        Group("predictions", "one per update of a PP-ASGD shard", Prediction),
        Group("prediction_errors", "one per PP-ASGD error probe of a block", PredictionError),
        Group("exchanges", "one per learners-only learner step", Exchange),
        Group("drift", "one per epoch end of a learners-only run", Drift),
        Group("rounds", "one per block round of bmuf or ma, per parameter block", Round),
        Group("learners_lost", "one per learner lost while the run went on", LearnerLost),
    )
}

#: root attributes: name -> type as docs/stats.md writes it
ROOT_ATTRS: dict[str, str] = {
    "config": "string (JSON)",
    "protocol": "string",
    "n_learners": "int",
    "n_servers": "int",
    "world_size": "int",
    "pserver_version": "string",
    "started": "string",
    "host": "string",
    "cores": "int",
    "finished": "string",
    "wall_time": "float",
    "stats_cpu_time": "float",
    "node_cpu_time": "float",
    "dropped_records": "string (JSON)",
    "dropped_records_total": "int",
    "data_scale": "string (JSON)",
    # provenance (pserver.runtime.provenance): which code, libraries, launch and ranks made the dump
    "git_commit": "string",
    "versions": "string (JSON)",
    "mpi_library": "string",
    "ranks": "string (JSON)",
    "run_dir": "string",
    "launch": "string (JSON)",
    "restarts": "int",
    # pserver-sim (docs/simulation.md): times simulated, no loss, no test, no model
    "simulated": "string (JSON)",
}

MODEL_WEIGHTS = "model/weights"  # the final flat vector, dtype of model.dtype (not a table)
#: data.scale's constants (learners/scaling.py), float64 vectors of 1 or F values: the features
#: the model saw are (x - offset) / scale (not tables)
DATA_SCALING = ("model/input_offset", "model/input_scale")


def typed_columns(group: str, columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``columns`` as arrays of the schema's dtypes; a column the group does not have raises
    ValueError. A group outside the schema keeps its arrays' own dtypes."""
    g = GROUPS.get(group)
    if g is None:
        return {name: np.asarray(v) for name, v in columns.items()}
    known = {c.name: c.dtype for c in g.columns}
    unknown = sorted(set(columns) - set(known))
    if unknown:
        raise ValueError(
            f"append to {group!r}: column(s) {unknown} are not in the dump schema "
            f"(pserver.dump.schema, docs/stats.md); {group!r} has {list(known)}"
        )
    return {name: np.asarray(v, dtype=known[name]) for name, v in columns.items()}


def as_columns(records: Iterable[Any]) -> dict[str, list[Any]]:
    """Rows of one record type as ``{column: [values]}`` (what a rank ships)."""
    out: dict[str, list[Any]] = {}
    for r in records:
        for f in dataclasses.fields(r):
            out.setdefault(f.name, []).append(getattr(r, f.name))
    return out
