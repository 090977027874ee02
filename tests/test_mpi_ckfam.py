"""Checkpoints, ``--resume`` and SIGTERM for the collective (SYNC, HYBRID) and model-averaging
(BMUF, MA) families on real mpiexec jobs (docs/checkpoints.md).

Every job runs under a hard timeout that kills its process group (tests/mpirun.py, and the
watchdog of ``stop_with_sigterm``); the signal is sent once the dump shows training under way
(an observable condition), never after a sleep. Before these families were covered, every
``--resume`` here was refused (exit 2) and a SIGTERM killed the ranks without a checkpoint.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from pserver.ckpt.files import latest, rank_file, read_state
from tests.mpirun import QUICKSTART, assert_learned, reseal, run_job
from tests.test_mpi_checkpoint import (
    assert_resumed_equals_whole,
    errors,
    final_model,
    stop_with_sigterm,
    train_rows,
    unslowed,
)

pytestmark = pytest.mark.mpi

QUIET = ["stats.progress=false"]
TIMEOUT = 240.0

#: (ranks for λ = 1, overrides): one learner, with the stats and data servers (and a shard
#: for BMUF/MA). BMUF with η = 0.5 and CBM/NBM so that Δ and the look-ahead matter.
FAMILIES = {
    "sync": (3, ["protocol.name=sync"]),
    "hybrid": (3, ["protocol.name=hybrid", "comm.mode=thread"]),
    "bmuf": (4, ["protocol.name=bmuf", "protocol.tau=3", "protocol.block_momentum=0.5"]),
    "ma": (4, ["protocol.name=ma", "protocol.tau=4", "optim.rule=nesterov"]),
}


def job(out: Path, n: int, *overrides: str, resume: bool = False):
    where = ["--resume", str(out)] if resume else [f"run.out_dir={out}"]
    return run_job(n, [str(QUICKSTART), *where, *QUIET, *overrides], TIMEOUT)


def learner_steps(out: Path, learners: list[int]) -> list[int]:
    """The step count each learner rank saved in the committed checkpoint."""
    m = latest(out / "checkpoint")
    return [read_state(rank_file(out / "checkpoint", m.generation, r)).attrs["steps"]
            for r in learners]  # fmt: skip


@pytest.mark.parametrize("name", list(FAMILIES))
def test_lambda1_resumed_at_a_run_end_equals_the_uninterrupted_run(tmp_path, name):
    """1 epoch, then ``--resume`` to 3: the same final weights, bit for bit, as 3 epochs in one
    go (SYNC/HYBRID: the learner's model, rule state and HYBRID's model before its last
    landing; BMUF/MA: the shard's W(t), Δ(t) and the served look-ahead)."""
    n, setting = FAMILIES[name]
    a, b = tmp_path / "a", tmp_path / "b"
    first = job(a, n, *setting, "run.epochs=1")
    assert first.returncode == 0, first.output
    assert latest(a / "checkpoint").generation == 1
    second = job(a, n, *setting, "run.epochs=3", resume=True)
    assert second.returncode == 0, second.output
    whole = job(b, n, *setting, "run.epochs=3")
    assert whole.returncode == 0, whole.output
    (wa, attrs_a), (wb, attrs_b) = final_model(a), final_model(b)
    assert attrs_a == attrs_b
    assert np.array_equal(wa, wb)
    with h5py.File(a / "stats.h5", "r") as f:
        assert f.attrs["restarts"] == 1
        assert list(f["test/epoch"][()]) == [1, 2, 3]  # the dump continued in place
    assert latest(a / "checkpoint").generation == 2


@pytest.mark.parametrize("name", list(FAMILIES))
def test_lambda1_sigterm_then_resume_is_bit_identical(tmp_path, name):
    """SIGTERM to mpiexec mid-run: every rank checkpoints, exit 75, and ``--resume`` ends with
    the uninterrupted run's weights (the learner stopped at a step, or a block, boundary)."""
    n, setting = FAMILIES[name]
    a, b = tmp_path / "a", tmp_path / "b"
    slow = [*setting, "run.epochs=4", "inject.compute_time=0.02", "stats.flush_interval=0.1"]
    stop_with_sigterm(a, slow, n)
    manifest = latest(a / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"] is True
    assert 20 <= train_rows(a / "stats.h5") < 4 * 85  # stopped mid-run
    assert_resumed_equals_whole(job(a, n, *slow, resume=True), job(b, n, *unslowed(slow)), a, b)


#: λ = 3: (ranks, learner ranks, overrides); MA's rate λ times the serial one (test_mpi_bmuf)
THREE = {
    "sync": (5, [2, 3, 4], ["protocol.name=sync"]),
    "hybrid": (5, [2, 3, 4], ["protocol.name=hybrid"]),
    "bmuf": (6, [3, 4, 5], ["protocol.name=bmuf", "protocol.tau=4"]),
    "ma": (6, [3, 4, 5], ["protocol.name=ma", "protocol.tau=4", "optim.lr=0.15"]),
}


@pytest.mark.parametrize("name", list(THREE))
def test_three_learners_stop_at_one_boundary_and_the_resumed_run_learns(tmp_path, name):
    """λ = 3, SIGTERM mid-run: the learners' vote stops all three at the same step (SYNC,
    HYBRID) or block start (BMUF, MA), so no allreduce or block round is left waiting (the job
    would hang) and the checkpoint is one cut; resumed to 20 epochs, the run learns."""
    n, learners, setting = THREE[name]
    a = tmp_path / "a"
    slow = [*setting, "inject.compute_time=0.01", "stats.flush_interval=0.1"]
    stop_with_sigterm(a, slow, n)
    steps = learner_steps(a, learners)
    assert len(set(steps)) == 1 and steps[0] > 0, steps
    if name in ("bmuf", "ma"):
        assert steps[0] % 4 == 0, steps  # at a block's start
    resumed = job(a, n, *slow, resume=True)
    assert resumed.returncode == 0, resumed.output
    from pserver.dump.reader import load_dump

    dump = load_dump(a / "stats.h5")
    assert dump.attrs["restarts"] == 1
    assert_learned(dump)


def test_refusals_keep_working_for_the_new_families(tmp_path):
    """Another rank count, a changed config, ADPSGD on another rank count, a learner's model
    of another shape: exit 2, one line."""
    n, setting = FAMILIES["sync"]
    a = tmp_path / "a"
    assert job(a, n, *setting, "run.epochs=1").returncode == 0

    def refused(*overrides: str, ranks: int = n) -> str:
        res = job(a, ranks, *overrides, resume=True)
        assert res.returncode == 2, res.output
        lines = errors(res.output)
        assert len(lines) == 1 and "Traceback" not in res.output, res.output
        return lines[0]

    assert "written by 3 ranks" in refused(*setting, ranks=4)
    assert "protocol.name" in refused("protocol.name=hybrid", "comm.mode=thread")
    gossip = refused("protocol.name=adpsgd", ranks=4)  # two learners: ADPSGD's fewest
    assert "written by 3 ranks" in gossip  # ADPSGD is covered now: the layout is refused
    learner = a / "checkpoint" / "g000001" / "rank-00002.h5"
    with h5py.File(learner, "r+") as f:  # a shorter model with a matching checksum
        short = f["exchange.w"][:10]
        del f["exchange.w"]
        f.create_dataset("exchange.w", data=short).attrs["crc32"] = zlib.crc32(short.tobytes())
    reseal(a / "checkpoint", 2)  # past LATEST's checksum of the file, to the shape check
    assert "'exchange.w' is float32[10]" in refused(*setting)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
