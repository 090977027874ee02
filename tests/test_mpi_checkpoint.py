"""Checkpoints, ``--resume`` and SIGTERM on real mpiexec jobs (docs/checkpoints.md).

Every job runs under a hard timeout that kills its process group (tests/mpirun.py, or the
watchdog below for the job a signal is sent to); the signal is sent once the dump shows
training under way (an observable condition), never after a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from pserver.ckpt.files import FORMAT, MANIFEST, latest
from pserver.job import launch
from tests.mpirun import QUICKSTART, ROOT, reseal, run_job

pytestmark = pytest.mark.mpi

LAMBDA1 = 4  # server, stats, data, one learner
QUIET = ["stats.progress=false"]
TIMEOUT = 180.0


def job(out: Path, *overrides: str, n: int = LAMBDA1, resume: bool = False):
    """One quickstart job writing into ``out`` (or continuing it with ``--resume``)."""
    where = ["--resume", str(out)] if resume else [f"run.out_dir={out}"]
    return run_job(n, [str(QUICKSTART), *where, *QUIET, *overrides], TIMEOUT)


def unslowed(args: list[str]) -> list[str]:
    """``args`` without the emulated compute (``inject.compute_time``) for the uninterrupted
    reference run: at λ = 1 the sleep moves no bit of the arithmetic, only the run's length, so
    the reference is not slowed (and equal weights also show that timing does not matter)."""
    return [a for a in args if not a.startswith("inject.compute_time=")]


def final_model(out: Path) -> tuple[np.ndarray, dict]:
    with h5py.File(out / "stats.h5", "r") as f:
        return f["model/weights"][()], dict(f["model/weights"].attrs)


def assert_resumed_equals_whole(resumed, whole, a: Path, b: Path) -> None:  # noqa: ANN001
    """The run resumed in ``a`` and the uninterrupted one in ``b`` both ended well with the
    same final model, bit for bit; ``a``'s dump has one train row per minibatch, in order, and
    counts one restart."""
    assert resumed.returncode == 0, resumed.output
    assert whole.returncode == 0, whole.output
    (wa, attrs_a), (wb, attrs_b) = final_model(a), final_model(b)
    assert attrs_a == attrs_b
    assert np.array_equal(wa, wb)
    with h5py.File(a / "stats.h5", "r") as f:
        steps = f["train/step"][()]
        assert list(steps) == list(range(len(steps)))  # one row per minibatch, in order
        assert f.attrs["restarts"] == 1


def errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("pserver-run: error:")]


@pytest.mark.parametrize(
    ("protocol", "mode"),
    [("hardsync", "blocking"), ("async", "blocking"), ("hardsync", "thread")],
)
def test_lambda1_resumed_at_a_run_end_equals_the_uninterrupted_run(tmp_path, protocol, mode):
    """2 epochs, then ``--resume`` for 2 more: the same final weights, bit for bit, as 4
    epochs in one go (the data stream replays the minibatches prefetched but never used)."""
    a, b = tmp_path / "a", tmp_path / "b"
    setting = [f"protocol.name={protocol}", f"comm.mode={mode}"]
    first = job(a, *setting, "run.epochs=2")
    assert first.returncode == 0, first.output
    assert latest(a / "checkpoint").generation == 1
    second = job(a, *setting, "run.epochs=4", resume=True)
    assert second.returncode == 0, second.output
    whole = job(b, *setting, "run.epochs=4")
    assert whole.returncode == 0, whole.output
    (wa, attrs_a), (wb, attrs_b) = final_model(a), final_model(b)
    assert attrs_a["epoch"] == attrs_b["epoch"] == 4
    assert attrs_a["timestamp"] == attrs_b["timestamp"]
    assert np.array_equal(wa, wb)
    with h5py.File(a / "stats.h5", "r") as f:
        assert f.attrs["restarts"] == 1
        assert list(f["test/epoch"][()]) == [1, 2, 3, 4]  # the dump continued in place
    assert latest(a / "checkpoint").generation == 2


def start(args: list[str], n: int = LAMBDA1) -> subprocess.Popen:
    cmd = launch.mpi_command(n, [*launch.pserver_cli(), *args], launch.launcher())
    return subprocess.Popen(
        cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def train_rows(dump: Path) -> int:
    """Rows of ``train`` in the last published dump (0 before the first flush)."""
    try:
        with h5py.File(dump, "r") as f:
            return len(f["train/step"]) if "train/step" in f else 0
    except OSError:  # not published yet
        return 0


def stop_with_sigterm(out: Path, args: list[str], n: int = LAMBDA1) -> tuple[str, float]:
    """Start a job, SIGTERM its mpiexec once the dump shows 20 minibatches, and wait for it
    (killed past TIMEOUT); its output and the seconds from the signal to its end."""
    proc = start([str(QUICKSTART), f"run.out_dir={out}", *QUIET, *args], n)
    killer = threading.Timer(TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.daemon = True
    killer.start()
    try:
        while train_rows(out / "stats.h5") < 20 and proc.poll() is None and killer.is_alive():
            time.sleep(0.05)  # polls an observable condition: the published dump
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # mpiexec forwards it to every rank
        text, _ = proc.communicate()
        took = time.monotonic() - sent
    finally:
        killer.cancel()
    assert proc.returncode == 75, f"exit {proc.returncode} after SIGTERM:\n{text}"
    return text, took


def test_sigterm_checkpoints_every_rank_and_the_resumed_run_is_bit_identical(tmp_path):
    """SIGTERM to mpiexec once the dump shows 20 minibatches: every rank writes its state,
    the job exits 75 (resume me), and ``--resume`` ends with the uninterrupted run's weights."""
    a, b = tmp_path / "a", tmp_path / "b"
    slow = ["run.epochs=6", "inject.compute_time=0.02", "stats.flush_interval=0.1"]
    out, took = stop_with_sigterm(a, slow)
    manifest = latest(a / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"] is True, out
    files = sorted(p.name for p in (a / "checkpoint" / f"g{manifest.generation:06d}").iterdir())
    assert files == [f"rank-{r:05d}.h5" for r in range(LAMBDA1)]
    stopped_at = train_rows(a / "stats.h5")
    assert 20 <= stopped_at < 6 * 85, stopped_at  # stopped mid-run, the dump flushed
    print(f"SIGTERM to exit of the last rank: {took:.2f} s")
    assert_resumed_equals_whole(job(a, *slow, resume=True), job(b, *unslowed(slow)), a, b)


def rank_pid(tag: str, rank: int) -> int | None:
    """The pid of MPI rank ``rank`` of the job started with ``PSERVER_TEST_TAG=tag``."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if f"PSERVER_TEST_TAG={tag}".encode() in env and f"PMI_RANK={rank}".encode() in env:
            return int(d.name)
    return None


def signal_one(out: Path, n: int, rank: int, args: list[str], timeout: float = TIMEOUT) -> str:
    """Start a job, SIGTERM MPI rank ``rank`` alone once the dump shows 20 minibatches, wait
    for the job (killed past ``timeout``); asserts it did not hang and exited 75 (resumable),
    returns its output."""
    tag = f"{out.parent.name}-{out.name}"
    cmd = launch.mpi_command(
        n, [*launch.pserver_cli(), str(QUICKSTART), f"run.out_dir={out}", *QUIET, *args],
        launch.launcher(),
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1", PSERVER_TEST_TAG=tag),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    hung = threading.Event()

    def kill() -> None:
        hung.set()  # before the kill ends communicate() below
        os.killpg(proc.pid, signal.SIGKILL)

    killer = threading.Timer(timeout, kill)
    killer.daemon = True
    killer.start()
    try:
        while train_rows(out / "stats.h5") < 20 and proc.poll() is None and not hung.is_set():
            time.sleep(0.05)  # polls an observable condition: the published dump
        pid = rank_pid(tag, rank)
        assert pid is not None, f"rank {rank} not found"
        os.kill(pid, signal.SIGTERM)
        text, _ = proc.communicate()
    finally:
        killer.cancel()
    assert not hung.is_set(), f"the job hung after rank {rank} stopped:\n{text}"
    assert proc.returncode == 75, f"exit {proc.returncode}:\n{text}"  # one stopped: resumable
    return text


def test_sigterm_to_one_of_four_hardsync_learners_lets_the_others_finish(tmp_path):
    """λ = 4, SIGTERM to learner rank 7 only: it stops and says goodbye; the three others must
    train to the end. Before ``Rounds.retire`` their next hardsync round waited for the stopped
    learner forever (the job hung: what learners seeing one signal at different steps do)."""
    a = tmp_path / "a"
    signal_one(a, 8, 7, ["run.epochs=3", "inject.compute_time=0.01", "stats.flush_interval=0.1",
                         "cluster.servers=2", "blocks.count=2"])  # fmt: skip
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2, 3]  # the others trained to the end
    assert latest(a / "checkpoint").extra["stopped"] is True


def test_resume_refusals_exit_2_with_one_line(tmp_path):
    """A missing checkpoint, another rank count, a changed config, wrong shapes, a corrupt
    file: each ends every rank before training with exit 2 and one line."""
    a = tmp_path / "a"
    assert job(a, "run.epochs=1").returncode == 0

    def refused(*overrides: str, n: int = LAMBDA1, where: Path = a) -> str:
        res = job(where, *overrides, n=n, resume=True)
        assert res.returncode == 2, res.output
        lines = errors(res.output)
        assert len(lines) == 1, res.output
        assert "Traceback" not in res.output
        return lines[0]

    assert "no checkpoint there" in refused(where=tmp_path / "none")
    assert "written by 4 ranks" in refused(n=5)
    assert "optim.lr" in refused("optim.lr=0.5")
    gen = latest(a / "checkpoint").generation
    shard = a / "checkpoint" / f"g{gen:06d}" / "rank-00000.h5"
    with h5py.File(shard, "r+") as f:  # a shorter w0 with a matching checksum
        short = f["w0"][:10]
        del f["w0"]
        d = f.create_dataset("w0", data=short)
        d.attrs["crc32"] = zlib.crc32(short.tobytes())
    assert "SHA-256 differs" in refused()  # LATEST's checksum of the file (issue 22, D4)
    reseal(a / "checkpoint", 0)
    assert "'w0' is float32[10]" in refused()
    with h5py.File(shard, "r+") as f:  # one value changed behind the checksum's back
        f["w0"][0] += 1.0
    reseal(a / "checkpoint", 0)
    assert "corrupt" in refused()
    (a / "checkpoint" / MANIFEST).write_text(json.dumps({"format": FORMAT}))  # fields missing
    assert "cannot be read" in refused()


def test_a_checkpoint_that_cannot_be_written_is_reported_and_the_previous_one_kept(tmp_path):
    """A file where the next generation's directory goes (as a full disk would): exit 74, one
    line, LATEST still names generation 1; resuming from it again gives one dump, one row per
    epoch (the rows of the run whose checkpoint failed are dropped)."""
    a = tmp_path / "a"
    assert job(a, "run.epochs=1").returncode == 0
    blocker = a / "checkpoint" / "g000002"
    blocker.write_text("in the way")
    res = job(a, "run.epochs=2", resume=True)
    assert res.returncode == 74, res.output
    assert any("not committed" in ln for ln in errors(res.output)), res.output
    assert latest(a / "checkpoint").generation == 1
    blocker.unlink()
    res = job(a, "run.epochs=2", resume=True)
    assert res.returncode == 0, res.output
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2]
        assert f.attrs["restarts"] == 1  # the restart counted from the committed generation


def test_unsupported_modes_are_refused_with_one_line(tmp_path):
    # an aggregator tree was refused here ("not supported with cluster.tree_fanout") until its
    # cut was drained (tests/test_mpi_ckpt_tree.py): --resume now reaches the checkpoint itself
    res = run_job(5, [str(QUICKSTART), "--resume", str(tmp_path), *QUIET,
                      "cluster.tree_fanout=2", "cluster.servers=1"], TIMEOUT)
    assert res.returncode == 2, res.output
    lines = errors(res.output)
    assert len(lines) == 1 and "no checkpoint there" in lines[0], res.output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
