"""A stopped learner must not stop the others (issue 10, item 3): pulls are served from versions.

Learner 0 stops for ``FREEZE`` seconds right after its push and pull request of minibatch
``STEP`` (``inject.freeze_*``: it sleeps without calling MPI, as a ``SIGSTOP``ped process
would), so the shard's (or aggregator's, or parent learner's) weight send to it cannot complete
until it wakes. Before versions, the shard waited for that send before its next update, and no
update happened while learner 0 slept. Now the updates go on: the test counts the updates the
dump records inside the freeze (from the frozen learner's own ``train`` row of that minibatch,
written when it woke; the first ``LAG`` seconds are left out, in which the shard may still be
handling what came before the freeze) and checks that the other learners' gradients are in them.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import train

from pserver.dump.reader import load_dump

pytestmark = pytest.mark.mpi

STEP, FREEZE, LAG = 4, 2.0, 0.25
BASE = (
    "inject.freeze_learner=0",
    f"inject.freeze_step={STEP}",
    f"inject.freeze_time={FREEZE}",
    "inject.compute_time=0.003",
    "run.epochs=4",  # the others are still busy when the freeze ends
)
CASES = {
    "async-blocking": ("protocol.name=async",),
    "async-nonblocking": ("protocol.name=async", "comm.mode=nonblocking"),
    "psp-c3": ("protocol.name=psp", "protocol.c=3"),  # c = λ - 1
    "ssp": ("protocol.name=ssp", "protocol.s=100"),  # the others may run 100 clocks ahead
    "async-shm-blocks": ("protocol.name=async", "comm.transport=shm", "blocks.count=4"),
    # blocks above MPICH's eager size (a send then needs the receiver to call into MPI)
    "async-two-shards": (
        "protocol.name=async", "cluster.servers=2", "blocks.count=4", "model.hidden=[512]",
    ),
    "async-staged": ("protocol.name=async", "comm.staging=always"),
    # the bound: the sleeper pins one old version, the others need the current one and a spare
    "async-3-versions": ("protocol.name=async", "comm.versions=3"),
}


def updates_while_frozen(dump) -> tuple[int, set[int]]:  # noqa: ANN001
    """(updates of shard 0 inside the freeze, learners whose gradients entered them)."""
    t = dump.group("train")
    row = (t["learner"] == 0) & (t["step"] == STEP)
    woke = float(t["time"][row][0])  # the row is written after the freeze
    start, end = woke - FREEZE + LAG, woke - 0.05
    u, g = dump.group("updates"), dump.group("gradients")
    inside = (u["shard"] == 0) & (u["time"] > start) & (u["time"] < end)
    stamps = set(u["timestamp"][inside].tolist())
    applied = (g["shard"] == 0) & np.isin(g["update"], list(stamps))
    return int(inside.sum()), set(g["learner"][applied].tolist())


@pytest.mark.parametrize("case", list(CASES))
def test_a_stopped_learner_does_not_stop_the_updates(tmp_path, case):
    n = 8 if "cluster.servers=2" in CASES[case] else 7
    train(tmp_path, n, *BASE, *CASES[case], timeout=180)
    dump = load_dump(tmp_path / "stats.h5")
    count, learners = updates_while_frozen(dump)
    assert count >= 10, f"only {count} updates while learner 0 was stopped"
    assert learners - {0}  # the others' gradients kept entering updates


def steps_while_frozen(dump, frozen: int, other: int) -> int:  # noqa: ANN001
    """Minibatches learner ``other`` finished while learner ``frozen`` was stopped."""
    t = dump.group("train")
    woke = float(t["time"][(t["learner"] == frozen) & (t["step"] == STEP)][0])
    start, end = woke - FREEZE + LAG, woke - 0.05
    mine = (t["learner"] == other) & (t["time"] > start) & (t["time"] < end)
    return int(mine.sum())


def test_tree_aggregator_serves_children_past_a_stopped_one(tmp_path):
    """Tree (fan-out 2, 9 ranks): learners 0 and 1 share aggregator rank 3. With learner 0
    stopped, the aggregator must go on answering learner 1's pulls (its round waits for learner
    0's gradient by design, but learner 1 keeps computing on the newest weights). Learner 0 is
    3x slower, so its aggregator has newer weights for its every pull (a send, not CURRENT), and
    the model is larger (150 KB) so that no send fits MPI's eager size."""
    train(
        tmp_path, 9, *BASE, "protocol.name=async", "cluster.tree_fanout=2",
        "inject.slow_learner=0", "inject.learner_factor=3", "model.hidden=[512]",
        "run.epochs=8", timeout=180,
    )  # fmt: skip
    steps = steps_while_frozen(load_dump(tmp_path / "stats.h5"), 0, 1)
    assert steps >= 10, f"learner 1 did {steps} steps while its sibling was stopped"


def test_broadcast_tree_parent_keeps_training_past_a_stopped_child(tmp_path):
    """Learner broadcast tree (fan-out 2, 7 ranks): learner 0 pulls from the shard and serves
    learner 1. With learner 1 stopped, learner 0 must keep installing new models and training.
    Learner 1 is 3x slower, so learner 0 has a newer model for its every pull."""
    train(
        tmp_path, 7, "inject.freeze_learner=1", f"inject.freeze_step={STEP}",
        f"inject.freeze_time={FREEZE}", "inject.compute_time=0.003", "run.epochs=4",
        "inject.slow_learner=1", "inject.learner_factor=3",
        "protocol.name=async", "comm.mode=nonblocking", "cluster.bcast_fanout=2", timeout=180,
    )  # fmt: skip
    steps = steps_while_frozen(load_dump(tmp_path / "stats.h5"), 1, 0)
    assert steps >= 10, f"learner 0 did {steps} steps while its child was stopped"
