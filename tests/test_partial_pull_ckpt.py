"""Checkpoints of partial pulling and the iteration rule, in one process (partial_pull_ckpt).

The simulator of tests/test_partial_pull.py (the real PartialPull, PullRule and protocol
objects, FIFO channels, held pulls, injected reply delays) with a cut: at a moment every
learner stops at its step boundary (one waiting in a pull leaves it), says goodbye to every
block, and collects its last answers; a block answers the held pulls of a learner that said
goodbye STOP and closes a round that still has gradients once every learner left. Then the
learners' copies, timestamps and tags and the blocks' timestamps and round accounting are saved
and put into a fresh simulator, which runs to the end.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from pserver.ckpt.files import CheckpointError, State
from pserver.ckpt.records.partial_pull import (
    check_learner,
    keeps_copies,
    learner_state,
    restore_learner,
    restore_rounds,
    rounds_state,
)
from pserver.ckpt.resume import unsupported
from pserver.plan.config import Config
from pserver.protocols import Arrival
from pserver.protocols.partial_pull import ITERATION
from pserver.protocols.rudra import Hardsync
from tests.test_partial_pull import Sim


class CutSim(Sim):
    """:class:`Sim` stopped at ``cut_at`` (seconds), or resumed from ``saved``.

    ``bye_first``: a learner says goodbye before collecting the answers to its held pulls
    (the fix); False collects them first, as the block rule's cut does. ``keep_latest``:
    restore the blocks' round accounting.
    """

    def __init__(self, *, cut_at=None, saved=None, keep_latest=True, bye_first=True, **kw):
        super().__init__(rule=ITERATION, **kw)
        self.cut_at, self.bye_first = cut_at, bye_first
        self.pushes = 0
        for lr in self.learners:
            lr.update(left=False, stopping=False)
        for st in self.blocks:
            st["gone"] = set()
        if saved is not None:
            self.load(saved, keep_latest)
        self.resumed = saved is not None

    # -- the cut -------------------------------------------------------------------------------

    def run(self) -> bool:
        if self.cut_at is not None:
            self.at(self.cut_at, self.cut)
        if not self.resumed:
            return super().run()
        for k in range(len(self.learners)):  # a resumed learner pulls first (steps > 0)
            self.at(self.rng.uniform(0.0, 0.01), self.pull_first, k)
        while self.queue:
            self.now, _, fn, args = heapq.heappop(self.queue)
            fn(*args)
        return all(lr["finished"] for lr in self.learners)

    def cut(self):
        for k, lr in enumerate(self.learners):
            lr["stopping"] = True
            if lr["pulling"]:  # waiting in a pull: leave it (Trainer.interrupt)
                lr["pulling"] = False
                self.leave(k)

    def computed(self, k):
        self.pushes += 1
        lr = self.learners[k]
        if not lr["stopping"]:
            return super().computed(k)
        it = lr["rule"].push_iteration()  # the step's pushes, then the cut: no next pull
        for b in range(len(self.blocks)):
            if b not in lr["stopped"]:
                self.send(("up", k, b), self.on_push, b, k, lr["have"][b], it)
        self.leave(k)

    def leave(self, k):
        lr = self.learners[k]
        lr["left"] = True
        mail, lr["mail"] = lr["mail"], []
        for b, kind, ts in mail:  # answers that came during the last compute
            lr["asked"].discard(b)
            if kind == "weights":
                lr["have"][b] = max(lr["have"][b], ts)
        if self.bye_first or not lr["asked"]:
            self.goodbye(k)

    def goodbye(self, k):
        self.learners[k]["finished"] = True
        for b in range(len(self.blocks)):
            self.send(("up", k, b), self.on_bye, b, k)

    def on_reply(self, k, b, kind, ts):
        lr = self.learners[k]
        if not lr["left"]:
            return super().on_reply(k, b, kind, ts)
        lr["asked"].discard(b)  # collected after the cut: installed if newer, never asked again
        if kind == "weights":
            lr["have"][b] = max(lr["have"][b], ts)
        if not self.bye_first and not lr["asked"] and not lr["finished"]:
            self.goodbye(k)

    def on_bye(self, b, k):
        st = self.blocks[b]
        st["gone"].add(k)
        mine = [p for p in st["held"] if p[0] == k]
        st["held"] = [p for p in st["held"] if p[0] != k]
        for _ in mine:  # PullAnswers.release_departed
            self.send(("down", b, k), self.on_reply, k, b, "stop", st["ts"])
        proto = st["proto"]
        proto.retire(k)
        everyone = len(st["gone"]) == len(self.learners)
        if not st["done"] and len(proto.pending) and (proto.ready(self.now) or everyone):
            self.commit(b)

    def answer(self, b, k, have, oldest):
        if k in self.blocks[b]["gone"]:  # a delayed pull of a learner that left: STOP
            self.send(("down", b, k), self.on_reply, k, b, "stop", self.blocks[b]["ts"])
        else:
            super().answer(b, k, have, oldest)

    # -- save and resume -------------------------------------------------------------------------

    def save(self) -> dict:
        """What the ranks write: each learner's copies' timestamps and tag, each block's
        timestamp and round accounting (the weights themselves are not simulated)."""
        return {
            "learners": [
                learner_state(np.zeros(1), lr["have"], lr["rule"].tag, 1) for lr in self.learners
            ],
            "blocks": [(st["ts"], rounds_state(st["proto"].rounds)) for st in self.blocks],
        }

    def load(self, saved: dict, keep_latest: bool) -> None:
        for lr, state in zip(self.learners, saved["learners"], strict=True):
            _, have, lr["rule"].tag, _ = restore_learner(state)
            lr["have"] = have
        for st, (ts, rounds) in zip(self.blocks, saved["blocks"], strict=True):
            st["ts"], st["done"] = ts, ts >= self.rounds
            if keep_latest:
                restore_rounds(st["proto"].rounds, rounds, ts)

    def pull_first(self, k):
        lr = self.learners[k]
        live = [b for b in range(len(self.blocks)) if b not in lr["stopped"]]
        for b in live:
            self.ask(k, b)
        lr["pull"].start(self.now, {b: lr["rule"].oldest(lr["have"][b]) for b in live})
        lr["pulling"] = True
        self.maybe_compute(k)


SHAPES = [  # (learners, blocks, c, fraction): PSP with c < λ lets tags run ahead of blocks
    (4, 4, 4, 0.75),
    (3, 2, 2, 0.5),
    (4, 4, 2, 0.5),
    (5, 3, 1, 0.34),
    (2, 6, 2, 0.9),
]


def cut_and_resume(shape, seed, cut_at, **kw) -> tuple[bool, CutSim, CutSim | None]:
    learners, blocks, c, fraction = shape
    args = dict(learners=learners, blocks=blocks, c=c, fraction=fraction, rounds=40,
                seed=seed, delay_prob=0.1)  # fmt: skip
    first = CutSim(cut_at=cut_at, bye_first=kw.pop("bye_first", True), **args)
    finished = first.run()
    if not finished:
        return False, first, None
    second = CutSim(saved=first.save(), **kw, **{**args, "seed": seed + 1000})
    return second.run(), first, second


@pytest.mark.parametrize("shape", SHAPES)
def test_every_cut_ends_and_every_resumed_run_finishes(shape) -> None:
    """The cut ends (every learner collected its answers and left), nothing the blocks took is
    lost (no round holds a gradient when they save), and the resumed run trains to the end."""
    for seed in range(8):
        for cut_at in (0.03, 0.2, 0.5):
            ok, first, second = cut_and_resume(shape, seed, cut_at)
            assert second is not None, ("cut hung", shape, seed, cut_at)
            assert all(not lr["asked"] for lr in first.learners)
            assert all(len(st["proto"].pending) == 0 or st["done"] for st in first.blocks)
            assert ok, ("resume hung", shape, seed, cut_at, [b["ts"] for b in second.blocks])
            assert all(b["done"] for b in second.blocks)
            assert min(first.commits + second.commits) >= 1


def test_a_round_left_by_a_goodbye_can_wait_for_learners_that_already_answered() -> None:
    """Why a learner says goodbye before collecting its held pulls at a cut (the iteration
    rule). Hardsync, λ = 3, one block: learner 2 ran ahead (its tag-1 push reached the block in
    round 0), learner 1 pushed into round 1, learner 0 stopped and said goodbye. Round 1 then
    waits for learner 2's gradient (it answered in round 0) and learner 0's response: both
    would wait for ever, as would learners 1 and 2 for their pulls of weights >= 2. Their
    goodbyes (``PullAnswers.release_departed`` answers the held pulls STOP) end the wait
    instead, and the last one closes the round with the gradient it has (``ServerShard.on_bye``)."""
    p = Hardsync(3, 4, 4)
    for k, have, tag in [(0, 0, 0), (1, 0, 0), (2, 0, 1)]:
        assert p.on_gradient(Arrival(k, have, 0.0, tag), 0).accept
    assert p.ready()
    p.commit(0)
    assert p.on_gradient(Arrival(1, 1, 0.0, 1), 1).accept
    p.retire(0)
    assert not p.ready()  # round 1 waits: learner 0 gone, learner 2 answered in round 0
    assert len(p.pending) == 1  # closed at the last goodbye, with learner 1's gradient


def test_learner_state_round_trips_and_is_checked() -> None:
    w = np.arange(6, dtype=np.float32)
    state = learner_state(w, {1: 3, 0: 5}, tag=7, steps=12)
    assert state.attrs == {"steps": 12, "tag": 7, "have": [[0, 5], [1, 3]]}
    back, have, tag, steps = restore_learner(state)
    assert np.array_equal(back, w) and have == {0: 5, 1: 3} and (tag, steps) == (7, 12)
    saved = State({"exchange.w": w}, {"exchange": state.attrs})
    check_learner(saved, 6, np.float32, [0, 1], "here")
    with pytest.raises(CheckpointError, match="float32\\[6\\].*float32\\[7\\]"):
        check_learner(saved, 7, np.float32, [0, 1], "here")
    with pytest.raises(CheckpointError, match="held blocks \\[0, 1\\]"):
        check_learner(saved, 6, np.float32, [0, 1, 2], "here")
    with pytest.raises(CheckpointError, match="iteration tag are missing"):
        check_learner(State({}, {"exchange": {"steps": 3}}), 6, np.float32, [0, 1], "here")


def test_rounds_state_round_trips() -> None:
    p = Hardsync(3, 4, 4)
    p.on_gradient(Arrival(0, 2, 0.0, 5), 2)
    p.on_gradient(Arrival(2, 1, 0.0, 2), 2)
    saved = rounds_state(p.rounds)
    assert saved == {"latest": [[0, 5], [2, 2]]}
    q = Hardsync(3, 4, 4)
    restore_rounds(q.rounds, saved, 2)
    assert q.rounds.latest == {0: 5, 2: 2} and q.rounds.round == 2


def test_partial_pulling_is_checkpointable() -> None:
    cfg = Config()
    cfg.protocol.pull_fraction = 0.5
    assert keeps_copies(cfg) and unsupported(cfg) is None
    cfg.protocol.pull_fraction, cfg.protocol.pull_timestamp = 1.0, "iteration"
    assert keeps_copies(cfg) and unsupported(cfg) is None
    assert not keeps_copies(Config())
