"""Checkpoints of partial pulling and of the iteration rule (PSP-SGD Algorithm 1, worker lines
2-17; ``protocol.pull_fraction < 1`` or ``protocol.pull_timestamp = "iteration"``). Pure: no MPI.

What is saved
-------------

* **The learner** (:func:`learner_state`): its compute copy ``w`` (one copy per block, some of
  them kept from older iterations: worker lines 3-4), the timestamp ``have[b]`` of each copy,
  its iteration tag ``tag`` (the tag of its last push,
  :class:`pserver.protocols.partial_pull.PullRule`)
  and its step count. The blocking exchange without partial pulling pulls the whole model again
  on resume; a partial-pulling learner cannot (its next minibatch may compute on kept copies the
  shards no longer hold), so it restores them.
* **The shard** (:func:`rounds_state`, per block): the round accounting's ``latest``, the
  largest iteration tag each learner has pushed to the block (:class:`pserver.protocols.rounds
  .Rounds`): whether it has responded to the block's current round.
* Not saved, with the reason. :class:`~pserver.protocols.partial_pull.PartialPull` holds one
  iteration's bookkeeping (blocks wanted, used, dropped, the τ2 timer); a cut is taken at a step
  boundary, before the next iteration's :meth:`~pserver.protocols.partial_pull.PartialPull.start`,
  which
  resets all of it. The round's accepted gradients (``pending``) and the held pulls: the cut
  drains them (below). The shard's ``retired`` set: every learner comes back on resume.

The cut (``pserver.ckpt.drivers.end``), under the iteration rule
--------------------------------------------------------------

A learner stops at a step boundary: every push of its last iteration (tag τ) is sent, no
minibatch is half computed. Two things differ from the block rule, because a learner's tag may
lie several rounds ahead of a block (under PSP with c < λ, or with kept copies):

1. A learner waiting in a pull leaves it when a stop is asked (a signal, or a periodic pause
   that is due: ``Trainer.interrupt``); it computed nothing since its last push, so it is at
   the same step boundary. Without this, once a learner retires (its goodbye) a round whose
   every *other* learner had already responded (pushed a tag ≥ the round in an earlier round)
   has no gradient and no one to send one: the learners still pulling would wait for it for
   ever. The copies that arrived fresh before it left are installed, and its tag is not
   advanced (:meth:`PullRule.pulled` is not called): the tag stays that of its last push.
2. It says goodbye to its shards **before** collecting the answers to its outstanding pulls,
   and asks nothing again; the shard answers every pull that learner still has held (for an
   update, or injected delays) with STOP (``PullAnswers.release_departed``). Its held pulls
   may ask for rounds that only the other learners, stopping too, could have filled: collected
   first, as
   under the block rule, the learner with the second-lowest tag would wait for a round that the
   lowest one's goodbye left without a gradient. WEIGHTS answers that arrived before are
   installed into the copy (its ``have`` then names them).

A shard's loop ends once every learner said goodbye. A round open then with gradients in it
closes with them (``ServerShard.on_bye``), so ``pending`` is empty when the shard saves.

Why no gradient is lost or applied twice
----------------------------------------

A learner's pushes are delivered before its goodbye, and a shard reads a learner's messages in
order (MPI's non-overtaking rule on one communicator), so every push of the part reaches its
shard before the goodbye; the shard takes or drops it then, and an open round is closed with
the gradients it has when the last learner leaves. The weights saved thus contain every
gradient the dump says was taken, once. The resumed learner sends nothing again: its first
action is a pull (``steps > 0``), its next push carries a new minibatch. Pulls move no
gradient; a reply collected at the cut is installed or not, and on resume the learner asks
every block again for weights at ≥ tag + 1 (judged as in any iteration).

Why no round waits forever after the resume
-------------------------------------------

The liveness proof of :mod:`pserver.protocols.rounds` rests on an invariant (while round r of
a block is open, some learner has ``latest < r``) and on assumptions A1-A5, A1 being that a
learner's tags strictly increase at every block; its last step uses that every learner stuck
in a pull has pushed its last tag (A1). All of it must hold across the resume:

* The tag is saved and the next iteration is tag + 1: the resumed learner's tags go on rising
  above every tag the shards have seen from it (A1). Reset to 0, its first tags would lie below
  the rounds it already answered, and its gradients from kept copies would be dropped as
  stale until the tag caught up. Its copies and their timestamps are saved with it, so A2
  (``τ = W`` or ``τ = min have ≤ have[j] ≤ ts_j``) holds: ``have`` never exceeds the shard's
  saved timestamp, and ``ts`` only rises.
* ``latest`` is saved, so the state after the resume is the state at the cut with the retired
  learners back, and a learner stuck in its first pull after the resume has "pushed its last
  tag" at every block, as the proof's last step needs. The invariant held at the cut:
  retirement does not change ``latest``, and a round that closed at the cut without every
  learner's response (the last goodbye closes a round holding gradients) leaves the learner
  that had not answered below the next round too. The resumed learners satisfy A1-A5 as any
  running learner does, so the proof's "training ends" applies to the resumed part.
* Independently of ``latest``: a learner's first pull after the resume is answered at once.
  Its last completed pull (iteration W, tag τ ≥ W) had ``ceil(b · blocks)`` blocks at ≥ W (or
  every block at ≥ τ when ``τ = min have``); its push with tag τ reached each of them in round
  τ or later, so each of those rounds τ closed, before the cut or at its last goodbye, and the
  blocks are at ≥ τ + 1, the first iteration's requirement (or done: STOP).

The one-process simulator in tests/test_partial_pull_ckpt.py cuts and resumes runs of five
shapes (hardsync and PSP with c < λ, b from 0.34 to 0.9, delayed replies) at three moments
and eight seeds: every cut ends, no round holds a gradient at the save, every resumed run
finishes.

What is exact: see docs/checkpoints.md, *Partial pulling*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pserver.ckpt.files import CheckpointError, State, attr, pairs
from pserver.plan.config import Config, pull_timestamp
from pserver.protocols.partial_pull import ITERATION

if TYPE_CHECKING:
    from pserver.protocols.rounds import Rounds


def keeps_copies(cfg: Config) -> bool:
    """Whether a blocking learner saves its copies and tag: partial pulling or the iteration
    rule (a whole-model learner of the block rule pulls the model again on resume)."""
    return cfg.protocol.pull_fraction < 1.0 or pull_timestamp(cfg) == ITERATION


@dataclass(frozen=True)
class CopiesRecord:
    """A partial-pulling learner's record: its compute copy ``w``, the timestamp of each
    block's copy (``have``), its iteration tag and its steps. On disk: the learner's
    ``exchange.w`` and its ``exchange`` attributes ``{"steps", "tag", "have": [[b, ts], ...]}``."""

    w: np.ndarray
    have: dict[int, int]
    tag: int
    steps: int

    def to_state(self) -> State:
        attrs = {
            "steps": int(self.steps),
            "tag": int(self.tag),
            "have": [[int(b), int(ts)] for b, ts in sorted(self.have.items())],
        }
        return State({"w": np.ascontiguousarray(self.w)}, attrs)

    @classmethod
    def from_state(cls, state: State, where: str = "checkpoint") -> CopiesRecord:
        """The record, refused (:class:`CheckpointError` naming the field) without ``w`` or
        with a tag, step count or block timestamp that is not an integer >= 0."""
        w = state.arrays.get("w")
        if w is None:
            raise CheckpointError(f"{where}: the checkpoint lacks the learner's copies 'w'")
        a = state.attrs
        tag = attr(a, "tag", int, where, 0)
        steps = attr(a, "steps", int, where, 0)
        have = {int(b): int(ts) for b, ts in pairs(a, "have", where)}
        return cls(w, have, tag, steps)


def learner_state(w: np.ndarray, have: dict[int, int], tag: int, steps: int) -> State:
    """A partial-pulling learner's checkpoint: its copies, their timestamps, its tag."""
    return CopiesRecord(w, have, tag, steps).to_state()


def restore_learner(
    state: State, where: str = "checkpoint"
) -> tuple[np.ndarray, dict[int, int], int, int]:
    """``(w, have, tag, steps)`` of :func:`learner_state`."""
    r = CopiesRecord.from_state(state, where)
    return r.w, r.have, r.tag, r.steps


def check_learner(
    state: State, n_params: int, dtype: Any, blocks: list[int], where: str
) -> None:
    """Refuse a learner file without the copies, tag and timestamps this run needs."""
    w = state.arrays.get("exchange.w")
    ex = state.attrs.get("exchange", {})
    if w is None or "tag" not in ex or "have" not in ex:
        raise CheckpointError(
            f"{where}: the learner's copies and iteration tag are missing (partial pulling)"
        )
    if tuple(w.shape) != (n_params,) or str(w.dtype) != str(np.dtype(dtype)):
        raise CheckpointError(
            f"{where}: 'exchange.w' is {w.dtype}{list(w.shape)} in the checkpoint, this run "
            f"needs {np.dtype(dtype)}{[n_params]} (the model or the data changed)"
        )
    # types and ranges first: restore_learner trusts them (issue 22, D4); a file of before
    # the record without ``steps`` reads as 0 steps
    record = CopiesRecord.from_state(State({"w": w}, {"steps": 0, **ex}), where)
    saved = sorted(record.have)
    if saved != sorted(blocks):
        raise CheckpointError(
            f"{where}: the learner held blocks {saved}, this run has blocks {sorted(blocks)}"
        )


@dataclass(frozen=True)
class RoundsRecord:
    """A block's round accounting at the cut: each learner's largest tag (its response). On
    disk: the block's ``rounds`` attribute, ``{"latest": [[learner, tag], ...]}``."""

    latest: dict[int, int]

    def to_state(self) -> State:
        return State({}, {"latest": [[int(k), int(t)] for k, t in sorted(self.latest.items())]})

    @classmethod
    def from_state(cls, saved: State, where: str = "checkpoint") -> RoundsRecord:
        """The record; no ``latest`` (a file of before it was saved) is an empty one."""
        if "latest" not in saved.attrs:
            return cls({})
        return cls({int(k): int(t) for k, t in pairs(saved.attrs, "latest", where)})


def rounds_state(rounds: Rounds) -> dict[str, Any]:
    """A block's round accounting at the cut: each learner's largest tag (its response)."""
    return RoundsRecord(dict(rounds.latest)).to_state().attrs


def restore_rounds(
    rounds: Rounds, attrs: dict[str, Any], ts: int, where: str = "checkpoint"
) -> None:
    """Put :func:`rounds_state`'s ``latest`` back into a fresh round accounting at ``ts``."""
    rounds.latest = dict(RoundsRecord.from_state(State({}, attrs), where).latest)
    rounds.round = int(ts)
