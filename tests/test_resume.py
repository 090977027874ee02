"""Pure parts of checkpoints and resume: the stop flag, a shard block's state, the continued
dump, what is supported (the MPI jobs are in tests/test_mpi_checkpoint.py)."""

from __future__ import annotations

import signal

import h5py
import numpy as np
import pytest

from pserver.ckpt.records.shard import block_state, expected_arrays, restore_block
from pserver.ckpt.resume import unsupported
from pserver.dump.writer import StatsWriter
from pserver.plan.config import Config, load_config
from pserver.protocols.shard_block import ShardBlock
from pserver.runtime.signals import SIGNALS, StopRequest


def test_the_first_signal_sets_the_flag_and_the_second_takes_the_default_action():
    before = {s: signal.getsignal(s) for s in SIGNALS}
    stop = StopRequest()
    try:
        stop.install()
        assert not stop.requested
        stop.handler(signal.SIGTERM, None)
        assert stop.requested and stop.signum == signal.SIGTERM
        assert all(signal.getsignal(s) == signal.SIG_DFL for s in SIGNALS)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def block(epochs: int) -> ShardBlock:
    cfg = Config()
    cfg.optim.rule, cfg.run.epochs, cfg.data.batch_size = "momentum", epochs, 4
    return ShardBlock.build(np.linspace(-1, 1, 10).astype(np.float32), cfg, 1, 16, np)


def steps(b: ShardBlock, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        g = rng.normal(size=10).astype(np.float32)
        buf = b.inbox()  # uninitialized: it may hold NaNs until written
        buf[:] = g
        b.accept([(0, b.ts, None)], buf, 0.0)
        assert b.ready(0.0)
        b.apply(b.commit())
        b.epoch_ends()


def test_a_block_restored_into_a_longer_run_continues_as_the_uninterrupted_one():
    """2 epochs (8 updates of 4 of 16 samples), saved, restored into a 4-epoch run: the next 8
    updates equal those of a 4-epoch block that never stopped (momentum state included)."""
    short, whole = block(2), block(4)
    steps(short, 8, seed=1)
    assert short.done
    arrays, attrs = block_state(short, 3, np.array)
    assert set(arrays) == set(expected_arrays(short, 3)) == {"w3", "opt3.velocity"}
    resumed = block(4)
    restore_block(resumed, 3, arrays, attrs, lambda host, out: np.copyto(out, host))
    assert not resumed.done and resumed.ts == 8 and resumed.epochs.next_epoch == 3
    steps(whole, 8, seed=1)
    steps(resumed, 8, seed=2)
    steps(whole, 8, seed=2)
    assert np.array_equal(resumed.w, whole.w)
    assert resumed.done and whole.done and resumed.ts == whole.ts == 16


def test_a_continued_dump_keeps_its_rows_and_appends(tmp_path):
    path = tmp_path / "stats.h5"
    with StatsWriter(path, {"run": 1}) as w:
        w.append("test", epoch=np.array([1.0]), time=np.array([0.5]),
                 samples=np.array([10]), timestamp=np.array([3]),
                 loss=np.array([1.0]), error=np.array([0.5]))
        w.append_clocks("updates", "vector_clock", [[1, 2]])
    with StatsWriter(path, {"run": 2}, resume=True) as w:
        assert w.rows() == {"test": 1, "updates/vector_clock": 1}
        w.append("test", epoch=np.array([2.0]), time=np.array([1.5]),
                 samples=np.array([20]), timestamp=np.array([6]),
                 loss=np.array([0.5]), error=np.array([0.25]))
        w.append_clocks("updates", "vector_clock", [[3, 4, 5]])
    with h5py.File(path, "r") as f:
        assert list(f["test/epoch"][()]) == [1.0, 2.0]
        assert f["updates/vector_clock"][()].tolist() == [[1, 2, -1], [3, 4, 5]]
        assert f.attrs["run"] == 2


def test_every_strategy_and_layout_is_checkpointable():
    """``unsupported`` once named trees, shm and partial pulling; each was refused until its
    cut was argued and tested (aggregator_ckpt, bcast, shm_ckpt, partial_pull_ckpt): now no
    registered strategy, transport, tree or pull rule is refused."""
    from pserver.strategies import REGISTRY

    for name in REGISTRY:
        assert unsupported(load_config(None, [f"protocol.name={name}"])) is None, name
    for extra in (["cluster.tree_fanout=2"], ["cluster.bcast_fanout=2", "comm.mode=thread"],
                  ["comm.transport=shm"],
                  ["protocol.name=psp", "protocol.pull_fraction=0.5", "blocks.count=2"],
                  ["protocol.pull_timestamp=iteration"]):  # fmt: skip
        assert unsupported(load_config(None, extra)) is None, extra


def test_the_shm_transport_is_checkpointed():
    """Refused until the window's state was argued and tested (pserver/ckpt/drivers/shm.py,
    tests/test_mpi_ckpt_shm.py); this case was ("comm.transport", "shm") of the list above."""
    for name in ("hardsync", "async", "bmuf", "ma"):
        cfg = load_config(None, ["comm.transport=shm", f"protocol.name={name}"])
        assert unsupported(cfg) is None, name


@pytest.mark.parametrize(("key", "tree"), [("tree_fanout", "aggregator tree"),
                                           ("bcast_fanout", "learner broadcast tree")])
def test_trees_are_checkpointed_and_a_changed_fanout_is_refused_by_name(key, tree):
    """Both trees were refused (``unsupported`` named them) before their cut was drained
    (pserver.ckpt.records.aggregator, pserver.roles.bcast); a resume must keep the fan-out."""
    from pserver.ckpt.files import CheckpointError
    from pserver.ckpt.resume import check_trees

    cfg = Config()
    cfg.comm.mode = "thread"
    setattr(cfg.cluster, key, 2)
    assert unsupported(cfg) is None
    saved = cfg.to_dict()
    check_trees(saved, cfg, "runs/x")  # unchanged: accepted
    setattr(cfg.cluster, key, 3)
    with pytest.raises(CheckpointError) as e:
        check_trees(saved, cfg, "runs/x")
    assert f"cluster.{key} = 2 ({tree}), this run has 3" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_learners_below_an_aggregator_are_its_subtrees():
    from pserver.ckpt.records.aggregator import departed_learners, subtree_learners
    from pserver.plan.topology import make_layout

    cfg = Config()
    cfg.cluster.tree_fanout, cfg.cluster.servers = 2, 1
    lay = make_layout(3 + 8 + 6, cfg)  # 8 learners, 4 leaf aggregators below 2 top ones
    below = {a: subtree_learners(lay, a) for a in lay.aggregators}
    tops = [a for a in lay.aggregators if a not in lay.parent]
    assert sorted(below[a] for a in tops) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    leaves = sorted(below[a] for a in lay.aggregators if a not in tops)
    assert leaves == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert departed_learners(lay, lay.learners[2]) == [2]
    assert departed_learners(lay, tops[0]) == below[tops[0]]


def test_a_continued_dump_drops_the_rows_written_after_its_checkpoint(tmp_path):
    path = tmp_path / "stats.h5"
    with StatsWriter(path, {}) as w:
        w.append("skipped_tests", epoch=np.array([1.0]), time=np.array([0.5]),
                 blocks_received=np.array([0]))
        w.append_clocks("updates", "vector_clock", [[1], [2]])
        at_checkpoint = w.rows()
        w.append("skipped_tests", epoch=np.array([2.0]), time=np.array([1.5]),
                 blocks_received=np.array([0]))
        w.append_clocks("updates", "vector_clock", [[3]])
    assert at_checkpoint == {"skipped_tests": 1, "updates/vector_clock": 2}
    with StatsWriter(path, {}, resume=True) as w:
        w.truncate(at_checkpoint)
    with h5py.File(path, "r") as f:
        assert list(f["skipped_tests/epoch"][()]) == [1.0]
        assert f["updates/vector_clock"][()].tolist() == [[1], [2]]


def test_a_hardsync_round_stops_waiting_for_a_learner_that_said_goodbye():
    """λ = 3: learner 0 stopped after its step k (a signal), 1 and 2 pushed step k+1: without
    retirement the round waited for learner 0 forever and the others' last pulls hung."""
    from pserver.protocols.base import Arrival
    from pserver.protocols.rudra import Hardsync

    p = Hardsync(3, 4, 4)
    for k in (1, 2):
        assert p.on_gradient(Arrival(k, 5, 0.0), 5).accept
    assert not p.ready()
    p.retire(0)
    assert p.ready()
    assert p.commit(5).divisor == 2
    p.retire(1)
    assert not p.ready()  # an empty round never updates


def test_a_psp_round_below_c_closes_once_the_others_said_goodbye():
    """λ = 4, c = 2: three learners paused (a periodic checkpoint) or stopped before the
    fourth pushed: its round has one gradient, below c, and before retirement the round (and
    the fourth's held pull) waited forever: a periodic psp run hung at its first pause."""
    from pserver.protocols.base import Arrival
    from pserver.protocols.psp import PartialPush

    p = PartialPush(4, 2, 0.01)
    for k in (0, 1, 2):
        p.retire(k)
    assert p.on_gradient(Arrival(3, 5, 0.0), 5).accept
    assert p.ready(0.0)
    assert p.commit(5).divisor == 1


def test_a_run_out_dir_override_is_refused_on_resume_unless_it_names_the_run_dir(tmp_path):
    """Issue 22, D10: another directory was silently replaced by the resumed one."""
    from pserver.ckpt.files import CheckpointError
    from pserver.ckpt.resume import check_out_dir
    from pserver.job.cli import out_dir_overrides

    run = tmp_path / "runs" / "q" / "7"
    same = out_dir_overrides([f"run.out_dir='{tmp_path}/runs/{{name}}/{{id}}'"], "q", "7")
    check_out_dir(str(run), same)  # what pserver.slurm passes beside --resume
    other = out_dir_overrides([f"run.out_dir={tmp_path / 'other'}", "run.epochs=3"], "q", "7")
    with pytest.raises(CheckpointError, match="drop the run.out_dir override"):
        check_out_dir(str(run), other)


def test_periodic_checkpoints_are_refused_where_they_are_known_to_hang():
    """An aggregator tree under the overlapped engines: a part resumed in place waited for ever
    (hardsync, 9 ranks); refused with one line instead, before training. ADPSGD: its learners
    pause at no common point, as its descriptor says."""
    from pserver.ckpt.files import CheckpointError
    from pserver.ckpt.resume import refuse_periodic
    from pserver.plan.config import load_config

    base = ["run.checkpoint_interval=0.3", "cluster.tree_fanout=2"]
    refuse_periodic(load_config(None, [*base, "comm.mode=blocking"]))  # runs (tested under MPI)
    for mode in ("nonblocking", "thread"):
        with pytest.raises(CheckpointError, match=r"aggregator tree .* \(a known defect\)"):
            refuse_periodic(load_config(None, [*base, f"comm.mode={mode}"]))
    with pytest.raises(CheckpointError, match="pause at no common point"):
        refuse_periodic(load_config(None, ["run.checkpoint_interval=1", "protocol.name=adpsgd"]))
