"""A shard block's checkpoint: what :class:`~pserver.protocols.shard_block.ShardBlock` holds
between two
rounds, as host arrays and JSON attributes, and back. Pure: no MPI.

Saved: the weights, the update rule's state arrays (``Updater.state_arrays``: momentum's
velocity, AdaGrad's sums), the timestamp, the gradients applied and dropped, and the epoch
counter; the epochs left to train and whether the block is done follow from these and the
resumed run's ``run.epochs``, so a finished run can be continued for more epochs.

The cut is taken once every learner has delivered its pushes and said goodbye
(``pserver.ckpt.drivers.end``): no gradient is on its way. A round still open there (λ > 1:
fewer than the round's gradients arrived) is not saved; its gradients are counted in the
``open_round`` attribute and the resumed block starts a fresh round. Protocol state (SSP's
clocks, PSP's deadlines) restarts level too, unless the protocol offers ``state()`` /
``restore()`` (the hook a protocol with state worth keeping fills); hardsync's and PSP's round
accounting keeps the largest iteration tag each learner pushed (``attrs["rounds"]``, what the
iteration rule's liveness needs across a resume: ``pserver.ckpt.records.partial_pull``). PP-ASGD's
predictor
(``protocol.predict``) is saved whole: ``pserver.ckpt.records.prediction``. With λ = 1 nothing is
lost: every round is one gradient, so the resumed run repeats the uninterrupted one bit for
bit (tests/test_mpi_checkpoint.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pserver.ckpt.files import CheckpointError, State, attr
from pserver.ckpt.records.partial_pull import RoundsRecord
from pserver.ckpt.records.prediction import (
    PredictorRecord,
    predictor_arrays,
    predictor_record,
    put_predictor,
)
from pserver.protocols.shard_block import ShardBlock

COUNTERS = ("ts", "applied", "dropped", "next_epoch")


@dataclass(frozen=True)
class BlockRecord:
    """Block ``index``'s record (see the module). On disk: the arrays ``w{index}`` and
    ``opt{index}.{name}`` (with the predictor's probe buffers) in the shard's file, and the
    block's entry of its ``blocks`` attribute: ``ts``, ``applied``, ``dropped``,
    ``next_epoch``, ``open_round`` and, where they apply, ``protocol``, ``rounds`` and
    ``predictor``."""

    index: int
    w: np.ndarray
    opt: dict[str, np.ndarray]
    ts: int
    applied: int
    dropped: int
    next_epoch: int
    open_round: int = 0  # gradients of a round left open at the cut (not saved, counted)
    protocol: Any = None  # a protocol's own ``state()``, when it has one
    rounds: RoundsRecord | None = None  # hardsync, psp: each learner's response
    predictor: PredictorRecord | None = None  # PP-ASGD

    def to_state(self) -> State:
        arrays = {f"w{self.index}": self.w}
        for name, a in self.opt.items():
            arrays[f"opt{self.index}.{name}"] = a
        attrs: dict[str, Any] = {
            "ts": self.ts,
            "applied": self.applied,
            "dropped": self.dropped,
            "next_epoch": self.next_epoch,
            "open_round": self.open_round,
        }
        if self.protocol is not None:
            attrs["protocol"] = self.protocol
        if self.rounds is not None:
            attrs["rounds"] = self.rounds.to_state().attrs
        if self.predictor is not None:
            p = self.predictor.to_state()
            attrs["predictor"] = p.attrs
            arrays.update(p.arrays)
        return State(arrays, attrs)

    @classmethod
    def from_state(
        cls, saved: State, index: int, opt_names: list[str], predicts: bool = False,
        probed: bool = False, where: str = "checkpoint",
    ) -> BlockRecord:  # fmt: skip
        """Block ``index``'s record from the shard file's arrays and the block's attributes
        (``saved``), with the update rule's arrays ``opt_names`` and, when ``predicts``, the
        predictor (its probe's buffers when ``probed``). Refused (:class:`CheckpointError`
        naming the field) where an array is missing or a counter is not an integer >= 0."""
        at = f"{where} block {index}"
        names = [f"w{index}", *(f"opt{index}.{n}" for n in opt_names)]
        missing = [n for n in names if n not in saved.arrays]
        if missing:
            raise CheckpointError(f"{at}: the checkpoint lacks {missing[0]!r}")
        a = saved.attrs
        ts, applied, dropped, next_epoch = (attr(a, k, int, at, 0) for k in COUNTERS)
        open_round = attr(a, "open_round", int, at, 0) if "open_round" in a else 0
        rounds = None
        if "rounds" in a:
            rounds = RoundsRecord.from_state(State({}, attr(a, "rounds", dict, at)), at)
        predictor = None
        if predicts:
            p = State(saved.arrays, attr(a, "predictor", dict, at))
            predictor = PredictorRecord.from_state(p, index, probed, where)
        opt = {n: saved.arrays[f"opt{index}.{n}"] for n in opt_names}
        return cls(index, saved.arrays[f"w{index}"], opt, ts, applied, dropped, next_epoch,
                   open_round, a.get("protocol"), rounds, predictor)  # fmt: skip


def block_state(b: ShardBlock, index: int, to_host: Any) -> tuple[dict[str, np.ndarray], dict]:
    """``(arrays, attrs)`` of block ``index``; ``to_host(a)`` copies a backend array to numpy."""
    opt = {name: to_host(a) for name, a in b.updater.state_arrays().items()}
    save = getattr(b.protocol, "state", None)
    rounds = getattr(b.protocol, "rounds", None)
    predictor = None
    if b.predictor is not None:  # PP-ASGD: S̄, the last rate and S, the probe in flight
        predictor = predictor_record(b.predictor, index, to_host)
    record = BlockRecord(
        index, to_host(b.w), opt, b.ts, b.applied, b.dropped, b.epochs.next_epoch, b.in_round,
        save() if callable(save) else None,
        # hardsync, psp: each learner's response (pserver.ckpt.records.partial_pull)
        RoundsRecord(dict(rounds.latest)) if rounds is not None else None,
        predictor,
    )  # fmt: skip
    state = record.to_state()
    return state.arrays, state.attrs


def restore_block(
    b: ShardBlock, index: int, arrays: dict[str, np.ndarray], attrs: dict, copy_in: Any
) -> None:
    """Put block ``index``'s saved state into ``b`` (built fresh from the resumed config);
    ``copy_in(host, out)`` copies a numpy array into a backend array."""
    opt_arrays = b.updater.state_arrays()
    p = b.predictor
    probed = p is not None and bool(p.probe.every)
    r = BlockRecord.from_state(State(arrays, attrs), index, list(opt_arrays), p is not None, probed)
    copy_in(r.w, b.w)
    for name, a in opt_arrays.items():
        copy_in(r.opt[name], a)
    b.ts, b.applied, b.dropped = r.ts, r.applied, r.dropped
    b.epochs.next_epoch = r.next_epoch
    b.in_round, b.held = 0, None
    b.done = b.epochs.samples(b.applied, b.dropped) >= b.epochs.total_samples
    load = getattr(b.protocol, "restore", None)
    if callable(load) and r.protocol is not None:
        load(r.protocol)
    rounds = getattr(b.protocol, "rounds", None)
    if rounds is not None and r.rounds is not None:
        rounds.latest = dict(r.rounds.latest)
        rounds.round = r.ts
    if p is not None and r.predictor is not None:
        put_predictor(p, r.predictor, copy_in)
    after = getattr(b, "restored", None)  # a block serving another model than w (BMUF's)
    if callable(after):
        after()


def expected_arrays(b: ShardBlock, index: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every array :func:`block_state` writes for ``b``."""
    out = {f"w{index}": (tuple(b.w.shape), str(b.w.dtype))}
    for name, a in b.updater.state_arrays().items():
        out[f"opt{index}.{name}"] = (tuple(a.shape), str(a.dtype))
    if b.predictor is not None:
        out.update(predictor_arrays(b.predictor, index))
    return out
