"""Periodic checkpoints (``run.checkpoint_interval``) on real mpiexec jobs (docs/checkpoints.md).

Every job runs under a hard timeout that kills its process group (tests/mpirun.py, or the
watchdog below for the job that is killed); the kill is sent once ``LATEST`` names a periodic
generation (an observable condition), never after a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from pserver.ckpt.files import latest, rank_file, read_state
from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.job import launch
from tests.mpirun import QUICKSTART, ROOT, final_weights, run_job
from tests.test_mpi_checkpoint import unslowed

pytestmark = pytest.mark.mpi

LAMBDA1 = 4  # server, stats, data, one learner
TIMEOUT = 180.0
# about 4 s of training (255 minibatches of 20 ms): several pauses of a 0.5 s interval
SLOW = ["stats.progress=false", "run.epochs=3", "inject.compute_time=0.02",
        "stats.flush_interval=0.1"]  # fmt: skip
PERIODIC = "run.checkpoint_interval=0.5"


def job(out: Path, *overrides: str, resume: bool = False, n: int = LAMBDA1, slow: bool = True):
    """A SLOW quickstart job; ``slow=False`` for a reference run, without the emulated compute."""
    where = ["--resume", str(out)] if resume else [f"run.out_dir={out}"]
    base = SLOW if slow else unslowed(SLOW)
    return run_job(n, [str(QUICKSTART), *where, *base, *overrides], TIMEOUT)


def lines(text: str, prefix: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> np.ndarray:
    """The final weights of the run without any checkpoint but its end's."""
    out = tmp_path_factory.mktemp("whole")
    res = job(out, slow=False)
    assert res.returncode == 0, res.output
    return final_weights(out)


def periodic_generation(ckpt: Path) -> int | None:
    """The committed generation when ``LATEST`` names a periodic one, else None."""
    m = latest(ckpt)  # LATEST is replaced atomically: never read half written
    return m.generation if m is not None and m.extra.get("periodic") else None


def kill_after_a_periodic_checkpoint(out: Path) -> int:
    """Start a periodic job, SIGKILL its whole process group as soon as ``LATEST`` names a
    periodic generation, and return that generation (the kill may land during a later write)."""
    args = [str(QUICKSTART), f"run.out_dir={out}", *SLOW, PERIODIC]
    cmd = launch.mpi_command(LAMBDA1, [*launch.pserver_cli(), *args], launch.launcher())
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    killer = threading.Timer(TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.daemon = True
    killer.start()
    seen = None
    try:
        while seen is None and proc.poll() is None and killer.is_alive():
            seen = periodic_generation(out / "checkpoint")
            time.sleep(0.02)  # polls an observable condition: the committed manifest
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
    finally:
        killer.cancel()
    assert seen is not None, (
        f"no periodic checkpoint was committed (exit {proc.returncode}):\n{text}"
    )
    assert proc.returncode != 0, "the job ended before the kill: nothing was interrupted"
    return seen


def test_lambda1_killed_after_a_periodic_checkpoint_resumes_bit_identical(tmp_path, uninterrupted):
    """SIGKILL (no checkpoint of its own) once a periodic generation is committed: ``--resume``
    continues from the last committed one and ends with the uninterrupted run's weights; the
    resumed dump is consistent (one train row per minibatch, the end rows of every part)."""
    a = tmp_path / "a"
    gen = kill_after_a_periodic_checkpoint(a)
    manifest = latest(a / "checkpoint")
    assert manifest.generation >= gen >= 1
    for r in range(LAMBDA1):  # every rank's file of the committed generation reads back
        read_state(rank_file(a / "checkpoint", manifest.generation, r))
    resumed = job(a, PERIODIC, resume=True)
    assert resumed.returncode == 0, resumed.output
    assert np.array_equal(final_weights(a), uninterrupted)
    dump = load_dump(a / "stats.h5")
    assert check_dump(dump) == []
    with h5py.File(a / "stats.h5", "r") as f:
        steps = f["train/step"][()]
        assert list(steps) == list(range(len(steps)))  # no row lost, none twice
        assert f.attrs["restarts"] == 1  # the periodic parts are not restarts
        assert list(f["test/epoch"][()]) == [1, 2, 3]
    assert latest(a / "checkpoint").extra["periodic"] is False  # the end's own generation


def test_periodic_generations_that_cannot_be_written_keep_the_previous_one(tmp_path, uninterrupted):
    """Files where generations 2.. go (as a full disk would): each periodic one is reported in
    one warning line and training goes on, the run's end checkpoint fails with exit 74, and
    LATEST still names generation 1, from which ``--resume`` ends bit-identical."""
    a = tmp_path / "a"
    ckpt = a / "checkpoint"
    ckpt.mkdir(parents=True)
    blockers = [ckpt / f"g{g:06d}" for g in range(2, 400)]
    for b in blockers:
        b.write_text("in the way")
    res = job(a, PERIODIC)
    assert res.returncode == 74, res.output
    warned = lines(res.output, "pserver-run: warning: periodic checkpoint generation")
    assert len(warned) >= 1 and all("not committed" in w for w in warned), res.output
    errs = lines(res.output, "pserver-run: error:")  # the end's checkpoint: as without periodic
    assert any("not committed" in e for e in errs), res.output
    manifest = latest(ckpt)
    assert manifest.generation == 1 and manifest.extra["periodic"] is True
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2, 3]  # training went on to the end
    for b in blockers:
        b.unlink()
    resumed = job(a, resume=True)
    assert resumed.returncode == 0, resumed.output
    assert np.array_equal(final_weights(a), uninterrupted)
    assert check_dump(load_dump(a / "stats.h5")) == []


def test_generations_one_rank_cannot_write_leave_no_files_behind(tmp_path):
    """Rank 3 cannot write its files of generations 2.. (a directory is in its way, as a full
    disk would stop it): the files the other ranks wrote there are removed at once, since on a
    full disk they would hold the space the dump's next flush needs (issue 22, D10); before,
    they stayed until a later generation was committed, which a full disk never allows."""
    a = tmp_path / "a"
    ckpt = a / "checkpoint"
    for g in range(2, 400):
        (ckpt / f"g{g:06d}" / "rank-00003.h5").mkdir(parents=True)  # in rank 3's way only
    res = job(a, PERIODIC)
    assert res.returncode == 74, res.output  # the end's generation could not be written either
    warned = lines(res.output, "pserver-run: warning: periodic checkpoint generation 2")
    assert warned and "ranks [3] could not write" in warned[0], res.output
    assert latest(ckpt).generation == 1
    tried = [d for d in ckpt.glob("g*") if d.name != "g000001"]
    assert len(tried) == 398
    assert all(sorted(f.name for f in d.iterdir()) == ["rank-00003.h5"] for d in tried)


def test_periodic_run_is_bit_identical_and_its_dump_consistent(tmp_path, uninterrupted):
    """Pausing for checkpoints changes nothing for λ = 1: same final weights; one train row per
    minibatch; the dump checks consistent; LATEST is the end's generation, after periodic ones."""
    a = tmp_path / "a"
    res = job(a, PERIODIC)
    assert res.returncode == 0, res.output
    assert np.array_equal(final_weights(a), uninterrupted)
    costs = lines(res.output.replace("] INFO ", "]\n"), "checkpoint generation")
    assert len(costs) >= 2 and "(periodic)" in costs[0], res.output  # one line each: gen, bytes, s
    assert latest(a / "checkpoint").generation == len(costs)
    assert check_dump(load_dump(a / "stats.h5")) == []


def test_bad_interval_and_unsupported_configs_are_refused_with_one_line(tmp_path):
    res = job(tmp_path / "a", "run.checkpoint_interval=-1")
    assert res.returncode == 2, res.output
    errs = lines(res.output, "pserver-run: error:")
    assert len(errs) == 1 and "run.checkpoint_interval" in errs[0], res.output
    # an aggregator tree was refused here until its cut was drained: it now pauses
    # (bit-identical with λ = 1: tests/test_mpi_ckpt_tree.py)
    res = job(tmp_path / "b", PERIODIC, "cluster.tree_fanout=2", "cluster.servers=1",
              "run.epochs=1", n=5)
    assert res.returncode == 0, res.output
    assert not lines(res.output, "pserver-run: error:"), res.output
    res = job(tmp_path / "c", PERIODIC, "protocol.name=adpsgd", "cluster.servers=0", n=4)
    assert res.returncode == 2, res.output
    errs = lines(res.output, "pserver-run: error:")
    assert len(errs) == 1 and "protocol.name = 'adpsgd'" in errs[0], res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "setting",
    [
        ("protocol.name=hardsync",),
        ("protocol.name=softsync", "protocol.n=2", "comm.mode=thread"),
        ("protocol.name=psp", "protocol.c=2", "protocol.tau1=0.01"),
        ("protocol.name=ssp",),
    ],
)
def test_lambda4_periodic_runs_pause_end_and_keep_a_consistent_dump(tmp_path, setting):
    """λ = 4, two shards: learners pause at different steps; each pause must end (before
    ``PartialPush.retire`` a psp round below c waited forever for the paused learners, with the
    last one's pull held), and a round open at the pause closes with the gradients it has (a
    dropped softsync round left gradient rows of updates that never took them)."""
    a = tmp_path / "a"
    res = run_job(
        8,
        [str(QUICKSTART), f"run.out_dir={a}", *SLOW, PERIODIC, "cluster.servers=2",
         "blocks.count=2", "inject.compute_time=0.01", *setting],
        TIMEOUT,
    )  # fmt: skip
    assert res.returncode == 0, res.output
    assert "(periodic)" in res.output, res.output
    assert check_dump(load_dump(a / "stats.h5")) == []
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2, 3]


#: the lockstep families (every learner must pause at one boundary: pserver.roles.stop_vote)
LOCKSTEP = {
    "sync": ["protocol.name=sync"],
    "hybrid": ["protocol.name=hybrid", "comm.mode=thread"],
    "bmuf": ["protocol.name=bmuf", "protocol.tau=3", "protocol.block_momentum=0.5",
             "cluster.servers=1"],
    "ma": ["protocol.name=ma", "protocol.tau=4", "cluster.servers=1"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(LOCKSTEP))
def test_lockstep_learners_pause_together_and_end_as_without_pauses(tmp_path, name):
    """λ = 3 SYNC/HYBRID/BMUF/MA with a 0.5 s interval: the learners' pause goes through their
    stop vote, so all pause at the same step (block) and the run goes on (before, a learner
    acted on its own clock only on the PS family: these runs were never paused); the paused
    run ends with the same final weights as the run without pauses, since a lockstep cut drops
    nothing and the draws are replayed in their places (BMUF/MA: λ = 1, whose draws do not
    depend on timing)."""
    servers = 1 if "cluster.servers=1" in LOCKSTEP[name] else 0
    learners = 1 if servers else 3
    n = 2 + servers + learners
    plain, paused = tmp_path / "plain", tmp_path / "paused"
    res = job(plain, *LOCKSTEP[name], n=n, slow=False)
    assert res.returncode == 0, res.output
    res = job(paused, *LOCKSTEP[name], PERIODIC, n=n)
    assert res.returncode == 0, res.output
    costs = lines(res.output.replace("] INFO ", "]\n"), "checkpoint generation")
    assert len(costs) >= 2 and "(periodic)" in costs[0], res.output
    assert np.array_equal(final_weights(paused), final_weights(plain))
    assert check_dump(load_dump(paused / "stats.h5")) == []
