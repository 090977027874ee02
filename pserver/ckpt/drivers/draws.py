"""The data server's checkpoint under a lockstep strategy (SYNC, HYBRID): where the draws stand.

A lockstep learner i gets draw kλ + i of the seeded stream as its k-th minibatch
(``pserver.protocols.lockstep.LockstepDraws``), however the requests arrive, and each gets exactly
its
quota of S minibatches (``DataQuota``). At the cut (``pserver.roles.stop_vote``) every learner
has computed on the same number c of minibatches (its goodbye says how many of this run's it
computed on). The draws c·λ … D−1 (D: drawn so far) were taken from the stream but no learner
computed on them: those waiting for a learner that has not asked yet, and those served but
only prefetched (the last ones served to each learner, kept by the data server for the PS
family's replay). They are saved in order, as the ``replay`` rows the PS family saves, with the
sampler's state after draw D − 1; on resume they are the pending draws again, the quota counts
c per learner, and learner i's next minibatch is draw c·λ + i, as in the uninterrupted run.

Pure: no MPI (the data server's own structures in, arrays out).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pserver.ckpt.files import CheckpointError, State

if TYPE_CHECKING:
    from learners.data import BatchSampler
    from pserver.plan.config import Config
    from pserver.plan.topology import Layout
    from pserver.protocols.lockstep import DataQuota, LockstepDraws


class StreamPlan(Protocol):
    """What the cut reads of the data server's plan."""

    @property
    def layout(self) -> Layout: ...
    @property
    def cfg(self) -> Config: ...


class LockstepStream(Protocol):
    """What the lockstep cut reads and writes of the data server (``DataServer`` is one):
    the draws, the sampler, the quota, what each learner was served and computed on, and
    ``base_steps`` (the steps a resumed run started from; read with a default of 0)."""

    @property
    def ctx(self) -> StreamPlan: ...
    @property
    def draws(self) -> LockstepDraws: ...
    @property
    def sampler(self) -> BatchSampler: ...
    @property
    def quota(self) -> DataQuota: ...
    consumed: dict[int, int]  # learner rank -> minibatches it computed on (its goodbye)
    count: dict[int, int]  # learner rank -> minibatches served
    recent: dict[int, deque[tuple[int, np.ndarray]]]  # the last served to each
    base_steps: int


def computed_on(ds: LockstepStream) -> int:
    """c: the minibatches every learner computed on (the same for all at a lockstep cut)."""
    base = getattr(ds, "base_steps", 0)
    counts = {base + n for n in ds.consumed.values()}
    if len(counts) != 1 or len(ds.consumed) != len(ds.count):
        raise CheckpointError(
            f"the lockstep learners stopped at different steps ({sorted(counts)}): no "
            "consistent cut to checkpoint"
        )
    return counts.pop()


def left_over(ds: LockstepStream, c: int) -> list[np.ndarray]:
    """The draws c·λ … D−1, in order (see the module docstring)."""
    draws, lay = ds.draws, ds.ctx.layout
    lam, base = draws.n_learners, getattr(ds, "base_steps", 0)
    out = []
    for n in range(c * lam, draws.drawn):
        if n in draws.pending:
            out.append(draws.pending[n])
            continue
        learner, k = n % lam, n // lam
        rank = lay.learners[learner]
        recent = ds.recent[rank]
        j = (k - base) - (ds.count[rank] - len(recent))  # its place among the last served
        if not 0 <= j < len(recent):
            raise CheckpointError(f"draw {n} (learner {learner}'s minibatch {k}) is lost")
        out.append(recent[j][1])
    return out


@dataclass(frozen=True)
class DrawsRecord:
    """The data server's record at a lockstep cut: the sampler's state and permutation, the
    draws no learner computed on (``replay``, one row per minibatch) and the steps c every
    learner computed on. Read from a state ``pserver.ckpt.files`` read and
    ``pserver.ckpt.resume.check_state`` checked (the replay's shape) before training."""

    sampler: dict[str, Any]
    perm: np.ndarray
    replay: np.ndarray
    steps: int

    def to_state(self) -> State:
        arrays = {"perm": self.perm, "replay": self.replay}
        attrs = {"role": "data", "sampler": self.sampler, "lockstep_steps": self.steps}
        return State(arrays, attrs)

    @classmethod
    def from_state(cls, state: State) -> DrawsRecord:
        a = state.attrs
        return cls(a["sampler"], state.arrays["perm"], state.arrays["replay"],
                   int(a["lockstep_steps"]))  # fmt: skip


def draws_state(ds: LockstepStream) -> State:
    """The data server's state at a lockstep cut (``ds``: a ``DataServer``)."""
    c = computed_on(ds)
    attrs, perm = ds.sampler.state()
    left = left_over(ds, c)
    batch = ds.ctx.cfg.data.batch_size
    replay = np.array(left, np.int64).reshape(len(left), batch)
    return DrawsRecord(attrs, perm, replay, c).to_state()


def restore_draws(ds: LockstepStream, state: State) -> None:
    """Resume a lockstep stream: c minibatches served to each learner, the saved draws pending."""
    record = DrawsRecord.from_state(state)
    ds.sampler.restore(record.sampler, record.perm)
    c = record.steps
    draws = ds.draws
    start = c * draws.n_learners
    draws.pending = {start + j: np.array(row) for j, row in enumerate(record.replay)}
    draws.drawn = start + len(draws.pending)
    ds.quota.served = dict.fromkeys(range(draws.n_learners), c)
    ds.base_steps = c
