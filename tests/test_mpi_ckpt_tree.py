"""Checkpoints with Rudra-adv's aggregator tree and the learner broadcast tree, on real mpiexec
jobs (docs/checkpoints.md, *Trees*; pserver/ckpt/records/aggregator.py, pserver/roles/bcast.py).

Both trees were refused (``--resume``, ``run.checkpoint_interval``) and a SIGTERM killed them.
What is exact: λ = 1 hardsync under an aggregator is deterministic (each relayed sum is the one
gradient itself), so its resumed runs equal the uninterrupted one bit for bit, from its end, from
SIGTERM and with periodic checkpoints. A broadcast tree needs two learners under one upstream,
and with λ > 1 which learner computes which minibatch depends on request order and a cut may
close a round with fewer gradients: those runs are held to exit 75, the dump continued in place
(one restart, ``pserver-stats check`` consistent), learning, and every computed minibatch's
gradient applied or counted as dropped, once. The signal to *one* learner (a hardsync learner
under an aggregator; the relaying learner of a broadcast tree) is the cut whose cycle hung
before (``Tag.RETIRE``, ``Reply.LEFT``). Every job runs under a hard timeout that kills its
process group (tests/mpirun.py, the watchdogs below).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from pserver.ckpt.files import latest, rank_file, read_state
from pserver.dump.check import check_dump, last_rows
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config
from pserver.plan.topology import make_layout
from tests.mpirun import QUICKSTART
from tests.test_mpi_checkpoint import (
    assert_resumed_equals_whole,
    errors,
    job,
    signal_one,
    stop_with_sigterm,
    train_rows,
    unslowed,
)

pytestmark = pytest.mark.mpi

TREE = ["protocol.name=hardsync", "cluster.tree_fanout=2"]  # 5 ranks: one aggregator, λ = 1
# about 3.4 s of training (170 minibatches of 20 ms): a SIGTERM or a 0.5 s pause lands mid-run
SLOW = ["run.epochs=2", "inject.compute_time=0.02", "stats.flush_interval=0.1"]
BCAST = ["protocol.name=hardsync", "comm.mode=thread", "cluster.bcast_fanout=2"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):  # noqa: ANN201 - (mpirun result, its run directory)
    """The uninterrupted λ = 1 tree run the SIGTERM and periodic runs are held to."""
    out = tmp_path_factory.mktemp("whole")
    res = job(out, *TREE, *unslowed(SLOW), n=5)
    assert res.returncode == 0, res.output
    return res, out


def test_tree_resumed_at_its_end_equals_the_uninterrupted_run(tmp_path):
    """1 epoch, then ``--resume`` for 2: the 2-epoch run's weights, bit for bit; the aggregator's
    byte counts go on over the parts."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert job(a, *TREE, "run.epochs=1", n=5).returncode == 0
    resumed = job(a, *TREE, "run.epochs=2", n=5, resume=True)
    assert_resumed_equals_whole(resumed, job(b, *TREE, "run.epochs=2", n=5), a, b)
    with h5py.File(a / "stats.h5", "r") as f:
        parts = f["aggregators/bytes_in"][()]
    assert len(parts) == 2 and 0 < parts[0] < parts[1]  # one row per part, counts cumulative


def test_tree_stopped_by_sigterm_resumes_bit_identical(tmp_path, whole):
    a = tmp_path / "a"
    out, _ = stop_with_sigterm(a, [*TREE, *SLOW], n=5)
    manifest = latest(a / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"] is True, out
    lay = make_layout(5, load_config(QUICKSTART, TREE))
    (agg,) = lay.aggregators
    state = read_state(rank_file(a / "checkpoint", manifest.generation, agg))
    assert state.attrs["role"] == "aggregator" and state.attrs["children"] == list(lay.learners)
    assert 20 <= train_rows(a / "stats.h5") < 170
    resumed = job(a, *TREE, *SLOW, n=5, resume=True)
    assert_resumed_equals_whole(resumed, whole[0], a, whole[1])


def test_tree_with_periodic_checkpoints_is_bit_identical(tmp_path, whole):
    a = tmp_path / "a"
    res = job(a, *TREE, *SLOW, "run.checkpoint_interval=0.5", n=5)
    assert res.returncode == 0, res.output
    assert "(periodic)" in res.output, res.output
    with h5py.File(a / "stats.h5", "r") as f, h5py.File(whole[1] / "stats.h5", "r") as g:
        assert np.array_equal(f["model/weights"][()], g["model/weights"][()])
    assert check_dump(load_dump(a / "stats.h5")) == []


def test_a_changed_fanout_is_refused_with_one_line(tmp_path):
    a = tmp_path / "a"
    assert job(a, *TREE, "run.epochs=1", n=5).returncode == 0
    res = job(a, "protocol.name=hardsync", "cluster.tree_fanout=3", n=5, resume=True)
    assert res.returncode == 2, res.output
    lines = errors(res.output)
    assert len(lines) == 1 and "cluster.tree_fanout = 2 (aggregator tree)" in lines[0], res.output
    assert "Traceback" not in res.output


# -- λ > 1: signals to one learner, then resume -------------------------------------------------


def assert_every_gradient_counted_once(out: Path) -> None:
    """Over all parts: the minibatches learners computed on (the data server's cut replays the
    others) = the gradients the first block applied + those its protocol dropped + those the
    shard drained after its stop (one row per part each)."""
    dump = load_dump(out / "stats.h5")
    computed = len(dump.group("train")["step"])
    blocks = last_rows(dump.group("blocks"), "block")
    first = int(np.argmin(blocks["block"]))
    servers = dump.group("servers")
    after_stop = int(servers["dropped_after_stop"][servers["shard"] == 0].sum())
    taken = int(blocks["applied"][first]) + int(blocks["dropped"][first]) + after_stop
    assert computed == taken, (computed, dict(blocks), after_stop)


def resume_and_check(out: Path, n: int, args: list[str]) -> None:
    """Resume for one more epoch: exit 0, one restart, the dump consistent, the run learned,
    every gradient counted once."""
    res = job(out, *args, "run.epochs=3", n=n, resume=True)
    assert res.returncode == 0, res.output
    with h5py.File(out / "stats.h5", "r") as f:
        assert f.attrs["restarts"] == 1
        assert list(f["test/epoch"][()]) == [1, 2, 3]  # the dump continued in place
        assert f["test/error"][-1] <= 0.15  # 3 epochs (chance is 0.9)
    assert check_dump(load_dump(out / "stats.h5")) == []
    assert_every_gradient_counted_once(out)


def learner_rank(n: int, args: list[str], index: int) -> int:
    return make_layout(n, load_config(QUICKSTART, args)).learners[index]


def test_hardsync_tree_learner_signalled_alone_lets_the_other_finish(tmp_path):
    """λ = 2 under one aggregator, SIGTERM to learner 0 only: it stops and says goodbye; its
    aggregator relays its retirement (``Tag.RETIRE``) so the shard's next rounds close without
    it and learner 1 trains to the end. Before, the shard heard of no learner's goodbye until
    the aggregator's own, and learner 1's next round waited for learner 0 for ever."""
    a, args = tmp_path / "a", [*TREE, *SLOW]
    out = signal_one(a, 6, learner_rank(6, args, 0), args)
    assert latest(a / "checkpoint").extra["stopped"] is True, out
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2]  # learner 1 trained to the end
    resume_and_check(a, 6, args)


def test_broadcast_tree_parent_signalled_alone_stops_its_child(tmp_path):
    """λ = 2 hardsync broadcast tree, SIGTERM to the relaying learner only: it answers its
    child's pull for a model it will not install ``Reply.LEFT``, the child stops at the same
    round, and the job ends in a checkpoint (exit 75). Before, the child waited for that model
    and the parent for the child's goodbye."""
    a, args = tmp_path / "a", [*BCAST, *SLOW]
    out = signal_one(a, 5, learner_rank(5, args, 0), args)
    assert latest(a / "checkpoint").extra["stopped"] is True, out
    assert train_rows(a / "stats.h5") < 170  # stopped mid-run
    resume_and_check(a, 5, args)


def test_broadcast_tree_sigterm_and_periodic_checkpoints(tmp_path):
    """SIGTERM to mpiexec (every rank), then resume; and a run with periodic checkpoints."""
    a, b, args = tmp_path / "a", tmp_path / "b", [*BCAST, *SLOW]
    stop_with_sigterm(a, args, n=5)
    assert latest(a / "checkpoint").extra["stopped"] is True
    resume_and_check(a, 5, args)
    res = job(b, *args, "run.checkpoint_interval=0.5", n=5)
    assert res.returncode == 0, res.output
    assert "(periodic)" in res.output, res.output
    assert check_dump(load_dump(b / "stats.h5")) == []
    assert_every_gradient_counted_once(b)
