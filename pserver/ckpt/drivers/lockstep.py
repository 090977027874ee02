"""A SYNC or HYBRID learner's checkpoint: its model, its update rule's state, its counters.

A lockstep learner owns the whole model (``pserver.roles.lockstep_model``): the weights, the
update rule's state arrays (momentum's velocity, AdaGrad's sums), the version (averaged
gradients applied), and the run plan's epoch counter. Every learner holds the same values (the
``drift`` rows check it), and each writes its own file (the rank layout is checked on resume).

The cut (``pserver.roles.stop_vote``): every learner stops at the same step boundary k, every
allreduce it started has completed, and the data server keeps the draws no learner computed on
(``pserver.ckpt.drivers.draws``). SYNC has applied the averages of steps 0 … k−1: its state is
that of the uninterrupted run before step k.

HYBRID (IBM Fig. 3) applies each average one step late: step k's gradient is computed on the
model *before* step k−1's average lands. ``done()`` lands that last average at the run's end
(the final model has every gradient applied), so the checkpoint keeps both: ``pre``, the model
before the last landing, which step k computes on, and the state after it (weights, rule
state, version, epoch counter), which the landing in step k's ``gradient()`` produces. On
resume the learner computes on ``pre``, and where the uninterrupted run would land step k−1's
average it takes the saved state after that landing instead: the same arithmetic, done once,
its ``exchanges`` row and epoch-end test already in the dump. With λ = 1 both resume bit for
bit (tests/test_mpi_ckfam.py).

Pure of MPI: host copies through the backend (``to_host``, ``copy_from_host``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pserver.ckpt.files import CheckpointError, State

if TYPE_CHECKING:
    from pserver.comm.backend import Backend
    from pserver.optim.local_update import LocalUpdate
    from pserver.protocols.lockstep import RunPlan


class LockstepOwner(Protocol):
    """What a lockstep learner's record reads and writes of its model (``LockstepModel`` is
    one): the weights, the update rule's state, the version, the epoch counter, the backend."""

    w: Any  # the model on the learner's device
    version: int

    @property
    def update(self) -> LocalUpdate: ...
    @property
    def plan(self) -> RunPlan: ...
    @property
    def backend(self) -> Backend: ...


@dataclass(frozen=True)
class LockstepRecord:
    """A lockstep learner's record: its weights, its update rule's state arrays, its version
    and epoch counter. Read from a state ``pserver.ckpt.files`` read and
    ``pserver.ckpt.resume.check_state`` checked (shapes, dtypes) before training."""

    w: np.ndarray
    opt: dict[str, np.ndarray]
    version: int
    next_epoch: int

    def to_state(self) -> State:
        arrays = {"w": self.w, **{f"opt.{k}": a for k, a in self.opt.items()}}
        return State(arrays, {"version": self.version, "next_epoch": self.next_epoch})

    @classmethod
    def from_state(cls, state: State, names: list[str]) -> LockstepRecord:
        """The record in ``state``, with the rule's arrays ``names``."""
        opt = {k: state.arrays[f"opt.{k}"] for k in names}
        a = state.attrs
        return cls(state.arrays["w"], opt, int(a["version"]), int(a["next_epoch"]))


def model_state(model: LockstepOwner) -> State:
    """``model``: a ``LockstepModel``; its weights, rule state, version and epoch counter."""
    to_host = model.backend.to_host
    opt = {k: to_host(a) for k, a in model.update.updater.state_arrays().items()}
    record = LockstepRecord(to_host(model.w), opt, model.version, model.plan.counter.next_epoch)
    return record.to_state()


def restore_model(model: LockstepOwner, state: State) -> None:
    copy_in = model.backend.copy_from_host
    arrays = model.update.updater.state_arrays()
    record = LockstepRecord.from_state(state, list(arrays))
    copy_in(record.w, model.w)
    for name, a in arrays.items():
        copy_in(record.opt[name], a)
    model.version = record.version
    model.plan.counter.next_epoch = record.next_epoch


class HybridCut:
    """HYBRID's two models at the cut (see the module docstring)."""

    def __init__(self, model: LockstepOwner) -> None:
        self.model = model
        self.pre: np.ndarray | None = None  # the model before the last landing (host copy)
        self.landed = False  # done() landed an average: ``pre`` differs from the final model
        self.post: np.ndarray | None = None  # resumed: the weights after that landing

    def before_last_landing(self, in_flight: bool) -> None:
        """At ``done()``, before the last average lands: keep the model step k computes on."""
        self.pre = np.array(self.model.backend.to_host(self.model.w), copy=True)
        self.landed = in_flight

    def state(self, steps: int) -> State:
        if self.pre is None:  # the run ended before done() (cannot happen after run())
            raise CheckpointError("HYBRID learner: no model before its last landing")
        s = model_state(self.model)
        attrs = {**s.attrs, "steps": steps, "landed": self.landed}
        return State({**s.arrays, "pre": self.pre}, attrs)

    def restore(self, state: State) -> int:
        """Put the state after the last landing in, then the model before it in ``w``; the
        steps taken. The next ``land()`` (:meth:`land_saved`) installs the saved landing."""
        restore_model(self.model, state)
        if state.attrs.get("landed"):
            self.post = np.array(state.arrays["w"], copy=True)
            self.model.backend.copy_from_host(state.arrays["pre"], self.model.w)
            self.model.version -= 1  # step k's gradient was computed before that landing
        return int(state.attrs["steps"])

    def land_saved(self) -> bool:
        """Resumed, where the landing of step k−1's average comes: install its saved result
        (rows and tests of that landing are in the dump already). False when there is none."""
        if self.post is None:
            return False
        self.model.backend.copy_from_host(self.post, self.model.w)
        self.model.version += 1
        self.post = None
        return True
