"""Checkpoints, ``--resume``, SIGTERM and periodic checkpoints over ``comm.transport = "shm"``
(docs/checkpoints.md, "The shared-memory transport"; the argument is in
pserver/ckpt/drivers/shm.py).

shm needs ``comm.mode = "blocking"`` (``config.validate``), so the overlapped modes do not
occur here. The λ = 1 cases take the window's three paths: one shard holding the model in one
block (the learner computes on the version in place and its gradient in its slot), two shards
and three blocks (versions copied out and acknowledged, gradients copied to the slots), and
versions that hold another model than ``w`` (PP-ASGD's prediction, BMUF's W_g).

Every job runs under a hard timeout that kills its process group (tests/mpirun.py, or the
watchdog of ``stop_with_sigterm``); signals are sent on an observable condition (the dump's
rows), never after a sleep.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

from pserver.ckpt.files import latest
from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.stats import cli as stats_cli
from tests.mpirun import QUICKSTART, assert_learned, final_weights, run_job
from tests.test_mpi_checkpoint import (
    assert_resumed_equals_whole,
    final_model,
    signal_one,
    stop_with_sigterm,
    train_rows,
    unslowed,
)

pytestmark = pytest.mark.mpi

SHM = "comm.transport=shm"
QUIET = ["stats.progress=false"]
TIMEOUT = 180.0
HANG = 120.0  # the job that hung before its fix: a few seconds when it does not

#: λ = 1 over the window: (ranks, overrides)
CASES = {
    "hardsync-zero-copy": (4, ["protocol.name=hardsync"]),
    "async-2-shards-copies": (
        5, ["protocol.name=async", "cluster.servers=2", "blocks.count=3", "optim.rule=adagrad"]
    ),
    "async-predict": (4, ["protocol.name=async", "protocol.predict=true"]),
    "bmuf": (4, ["protocol.name=bmuf", "protocol.tau=3", "protocol.block_momentum=0.5"]),
}


def job(out: Path, n: int, *overrides: str, resume: bool = False):
    where = ["--resume", str(out)] if resume else [f"run.out_dir={out}"]
    return run_job(n, [str(QUICKSTART), *where, *QUIET, SHM, *overrides], TIMEOUT)


def committed_files(out: Path, n: int) -> None:
    """The committed generation is a signal's, and holds one file per rank."""
    manifest = latest(out / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"] is True
    gen = out / "checkpoint" / f"g{manifest.generation:06d}"
    assert sorted(p.name for p in gen.iterdir()) == [f"rank-{r:05d}.h5" for r in range(n)]


@pytest.mark.parametrize("name", list(CASES))
def test_lambda1_resumed_at_a_run_end_equals_the_uninterrupted_run(tmp_path, name):
    """1 epoch, then ``--resume`` to 2: the uninterrupted run's final weights, bit for bit.
    Before: refused with exit 2 ("not supported with comm.transport")."""
    n, setting = CASES[name]
    a, b = tmp_path / "a", tmp_path / "b"
    first = job(a, n, *setting, "run.epochs=1")
    assert first.returncode == 0, first.output
    resumed = job(a, n, *setting, "run.epochs=2", resume=True)
    assert_resumed_equals_whole(resumed, job(b, n, *setting, "run.epochs=2"), a, b)
    assert final_model(a)[1]["epoch"] == 2
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2]  # the dump continued in place
    assert latest(a / "checkpoint").generation == 2


def slow(name: str) -> list[str]:
    """Case ``name`` slowed to about 3.4 s of training (170 minibatches of 20 ms)."""
    return [*CASES[name][1], "run.epochs=2", "inject.compute_time=0.02", "stats.flush_interval=0.1"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):  # noqa: ANN201 - the job's result and its run directory
    """The hardsync case run without a signal or a periodic checkpoint (and unslowed)."""
    out = tmp_path_factory.mktemp("whole")
    return job(out, 4, *unslowed(slow("hardsync-zero-copy"))), out


@pytest.mark.parametrize("name", ["hardsync-zero-copy", "async-2-shards-copies"])
def test_lambda1_sigterm_then_resume_is_bit_identical(tmp_path, name, uninterrupted):
    """SIGTERM to mpiexec mid-run: every rank checkpoints and the job exits 75; ``--resume``
    ends with the uninterrupted run's weights. Before: the ranks died of the signal."""
    n, a = CASES[name][0], tmp_path / "a"
    stop_with_sigterm(a, [SHM, *slow(name)], n)
    committed_files(a, n)
    assert 20 <= train_rows(a / "stats.h5") < 2 * 85  # stopped mid-run
    whole, b = uninterrupted
    if name != "hardsync-zero-copy":
        whole, b = job(tmp_path / "b", n, *unslowed(slow(name))), tmp_path / "b"
    assert_resumed_equals_whole(job(a, n, *slow(name), resume=True), whole, a, b)


def test_lambda1_periodic_checkpoints_change_nothing(tmp_path, uninterrupted):
    """``run.checkpoint_interval`` over the window: several periodic generations, the same
    final weights as without them, a consistent dump. Before: with the refusal lifted alone,
    each part restarted from w0 (the saved weights were a view of window version 0, which the
    next part's shard fills with w0 before restoring them)."""
    a = tmp_path / "a"
    res = job(a, 4, *slow("hardsync-zero-copy"), "run.checkpoint_interval=0.5")
    assert res.returncode == 0, res.output
    assert "(periodic)" in res.output, res.output
    assert latest(a / "checkpoint").generation >= 2
    whole, b = uninterrupted
    assert whole.returncode == 0, whole.output
    assert (final_weights(a) == final_weights(b)).all()
    assert check_dump(load_dump(a / "stats.h5")) == []


def test_lambda4_sigterm_then_resume_learns(tmp_path):
    """λ = 4, one shard and block (every learner computes on window versions in place):
    SIGTERM mid-run, every rank exits 75 with its file committed; the resumed run continues
    the dump (one restart), checks consistent and learns."""
    a, n = tmp_path / "a", 7
    slow = [SHM, "protocol.name=hardsync", "inject.compute_time=0.01", "stats.flush_interval=0.1"]
    _, took = stop_with_sigterm(a, slow, n)
    committed_files(a, n)
    print(f"SIGTERM to exit of the last rank (shm, λ = 4): {took:.2f} s")
    resumed = job(a, n, *slow, resume=True)
    assert resumed.returncode == 0, resumed.output
    dump = load_dump(a / "stats.h5")
    assert check_dump(dump) == []
    assert dump.attrs["restarts"] == 1
    assert_learned(dump)
    assert stats_cli.main(["check", str(a / "stats.h5")]) == 0  # pserver-stats check


def test_a_learner_stopped_alone_releases_its_window_version(tmp_path):
    """λ = 4 hardsync with two versions (``comm.versions = 2``), SIGTERM to one learner only:
    it stops holding a loan of the current version; the three others must train to the end.
    Before ``on_bye`` released that loan, the next update moved to the other version and every
    pull found no free one left: the job hung."""
    a = tmp_path / "a"
    # 10 epochs (~420 minibatches), not 3: the signal goes out once the dump shows 20, and on a
    # loaded machine the dump's rows lag the training by more than a 3-epoch run lasts (the run
    # had ended, exit 0, before the SIGTERM arrived)
    signal_one(a, 7, 6, [SHM, "comm.versions=2", "protocol.name=hardsync", "run.epochs=10",
                         "inject.compute_time=0.01", "stats.flush_interval=0.1"], HANG)  # fmt: skip
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == list(range(1, 11))  # the others trained to the end


def test_a_changed_transport_is_refused_with_one_line(tmp_path):
    """The checkpoint names no version or slot, but the config must stay the run's: resuming
    a shm run over messages is one ``pserver-run: error:`` line naming the key, exit 2."""
    a = tmp_path / "a"
    assert job(a, 4, "run.epochs=1").returncode == 0
    where = ["--resume", str(a)]
    res = run_job(4, [str(QUICKSTART), *where, *QUIET, "comm.transport=messages"], TIMEOUT)
    assert res.returncode == 2, res.output
    errs = [ln for ln in res.output.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(errs) == 1 and "comm.transport ('shm' -> 'messages')" in errs[0], res.output
    assert "Traceback" not in res.output
