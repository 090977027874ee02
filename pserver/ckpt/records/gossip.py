"""ADPSGD's checkpoint, pure: what a learner saves, where the epoch averages are cut, and the
check of a learner's saved state before training (no MPI; the roles' side is
``pserver.ckpt.drivers.gossip``).

A learner's state (its file's ``exchange.*`` arrays and ``exchange`` attributes, written by
the trainer, ``pserver.roles.trainer``): its model ``w``, its update rule's state arrays
(``opt.velocity``, ``opt.sum_sq``: the parameter-server path's, ``pserver.optim.local_update``), its
vector clock (its own step count and the latest step of every learner mixed into its model),
the index ``k`` of its next exchange (a sender alternates left and right neighbour by ``k``:
the ring's schedule has no random number generator) and the first epoch whose average it has
not joined yet (``next_epoch``, the same on every learner at the cut).

The cut of the epoch averages (``pserver.roles.gossip_model``): free-running learners end
epochs at different steps, and each joins the e-th allreduce of the models when its own count
ends epoch e. At the end of a run every learner tells the others (one small allreduce, MAX)
whether it was stopped by a signal and the last epoch it has joined or queued
(:func:`owed`); if any was stopped (:func:`agreed_cut`), every learner joins the averages up
to the largest such epoch K (with its model at the cut, as a straggler does) and no more, and
the resumed run's averages start at K + 1 (the final model's average is left to the run that
reaches the last epoch); if none was, the run ends as it always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pserver.ckpt.files import CheckpointError, State, attr, counts, expect

W = "w"  # the learner's model
OPT = "opt."  # prefix of the update rule's state arrays
ATTRS = ("clock", "k", "exchanged", "next_epoch")


@dataclass(frozen=True)
class GossipRecord:
    """An ADPSGD learner's record (see the module). On disk, under the trainer's
    ``exchange.`` prefix: the arrays ``w`` and ``opt.{name}``, the attributes ``clock`` (one
    step count per learner), ``k``, ``exchanged`` and ``next_epoch``."""

    w: np.ndarray
    opt: dict[str, np.ndarray]
    clock: tuple[int, ...]
    k: int
    exchanged: int
    next_epoch: int

    def to_state(self) -> State:
        arrays = {W: self.w, **{OPT + name: a for name, a in self.opt.items()}}
        attrs = {
            "clock": [int(s) for s in self.clock],
            "k": int(self.k),
            "exchanged": int(self.exchanged),
            "next_epoch": int(self.next_epoch),
        }
        return State(arrays, attrs)

    @classmethod
    def from_state(
        cls, state: State, opt_names: list[str], where: str = "checkpoint"
    ) -> GossipRecord:
        """The record of the exchange's state (prefix stripped), with the update rule's arrays
        ``opt_names``; refused (:class:`CheckpointError` naming the field) where an array is
        missing or a counter is not an integer >= 0."""
        names = [W, *(OPT + n for n in opt_names)]
        missing = [n for n in names if n not in state.arrays]
        if missing:
            raise CheckpointError(f"{where}: the checkpoint lacks 'exchange.{missing[0]}'")
        a = state.attrs
        clock = tuple(int(s) for s in counts(a, "clock", where))
        k, exchanged, next_epoch = (attr(a, n, int, where, 0) for n in ATTRS[1:])
        opt = {n: state.arrays[OPT + n] for n in opt_names}
        return cls(state.arrays[W], opt, clock, k, exchanged, next_epoch)


def owed(next_epoch: int, last_epoch: int) -> int:
    """The last epoch (< the run's last) whose average this learner has joined or queued;
    ``next_epoch`` is its epoch counter's first epoch not yet ended."""
    return min(next_epoch - 1, last_epoch - 1)


def agreed_cut(reduced: tuple[int, int]) -> tuple[bool, int]:
    """From the learners' MAX-reduced ``(stopped, owed)``: whether the run was stopped (by any
    learner) and the last epoch every learner joins the average of."""
    return bool(reduced[0]), int(reduced[1])


def minibatches_to(epoch: int, train_size: int, batch: int) -> int:
    """The smallest minibatch count that ends ``epoch`` (the epoch counter's unit)."""
    return math.ceil(epoch * train_size / batch)


def check_learner(
    state: State, n_params: int, dtype: Any, opt_names: list[str], n_learners: int, where: str
) -> None:
    """Refuse, before training, an ADPSGD learner's saved state that this run cannot use."""
    attrs = state.attrs.get("exchange", {})
    missing = [k for k in ATTRS if k not in attrs]
    if missing:
        raise CheckpointError(
            f"{where}: the checkpoint lacks this ADPSGD learner's {', '.join(missing)}"
        )
    if len(attrs["clock"]) != n_learners:
        raise CheckpointError(
            f"{where}: the saved vector clock has {len(attrs['clock'])} learners, this run "
            f"has {n_learners}"
        )
    dtype = np.dtype(dtype)
    for name in [W, *(OPT + n for n in opt_names)]:
        expect(state, f"exchange.{name}", (n_params,), dtype, where)
    n = len("exchange.")
    arrays = {k[n:]: v for k, v in state.arrays.items() if k.startswith("exchange.")}
    GossipRecord.from_state(State(arrays, attrs), opt_names, where)  # types and ranges
