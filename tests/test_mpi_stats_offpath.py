"""The statistics server is off the critical path: training goes on while it is stopped.

The statistics rank is frozen with SIGSTOP as soon as it starts serving, before any epoch
ends, and thawed only once a training rank reports (stall report) that it finished training
and now waits for the statistics server to take its last rows or snapshot. The dump must then
show every update made before any test ran, the epochs whose snapshots overflowed the bounded
queue as ``skipped_tests``, and each learner's ``train`` rows plus the rows it dropped (bounded
buffer) adding up to the minibatches it computed.

On the code before this fix the shards wait for the previous snapshot at the second epoch end
and the learners block in a pickled ``send``, so the first stall report names those waits and
the test fails on it.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pserver.dump.reader import load_dump
from pserver.job import launch
from tests.mpirun import QUICKSTART, ROOT

pytestmark = pytest.mark.mpi

TIMEOUT = 180.0
EPOCHS = 12  # more than the snapshot queue (8 for this model) + the one in flight + the final
STATS_RANK = 1  # one server: rank 0 is the shard, rank 1 the statistics server


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])  # the field after the state


def descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        pid = parent(pid)
    return False


def rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of MPI rank ``rank`` started by mpiexec ``launcher`` (Hydra sets PMI_RANK;
    it puts every rank in a session of its own, so ancestry, not the session, finds them)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            mine = {f"{var}={rank}".encode() for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")}
            if mine & set(env) and descends(int(entry.name), launcher):
                return int(entry.name)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return None


class Job:
    """An mpiexec job whose output lines are read as they come (a hard deadline on all)."""

    def __init__(self, n: int, args: list[str]) -> None:
        cmd = [*launch.launcher(), "-n", str(n), sys.executable, "-m", "pserver.job.cli", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        self.deadline = time.monotonic() + TIMEOUT
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.kill()
            raise AssertionError("job past its deadline:\n" + "".join(self.seen))
        return left

    def wait_line(self, *needles: str) -> str:
        """The next output line containing any of ``needles``."""
        while True:
            try:
                line = self.lines.get(timeout=self.left())
            except queue.Empty:
                continue  # left() raises past the deadline
            if line is None:
                raise AssertionError("job ended first:\n" + "".join(self.seen))
            self.seen.append(line)
            if any(n in line for n in needles):
                return line

    def wait_pid(self, rank: int) -> int:
        while (pid := rank_pid(self.proc.pid, rank)) is None:
            self.left()
            time.sleep(0.01)  # polls for the process to appear: a condition, not a delay
        return pid

    def finish(self) -> int:
        try:
            self.proc.wait(timeout=self.left())
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("job hung:\n" + "".join(self.seen)) from None
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return self.proc.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_training_goes_on_while_the_stats_server_is_stopped(tmp_path):
    job = Job(7, [
        str(QUICKSTART), f"run.out_dir={tmp_path}", f"run.epochs={EPOCHS}",
        "model.hidden=[256]",  # snapshots above MPICH's eager size: they need the receiver
        # a learner holds its rows till the end (flush_interval) and each learner computes
        # > 12 x 21 minibatches, so the bounded buffer must drop some: deterministically
        "comm.stall_timeout=1", "stats.buffer_rows=50", "stats.flush_interval=60",
    ])
    stopped = False
    try:
        pid = job.wait_pid(STATS_RANK)
        job.wait_line("writing")  # the statistics server serves: training has started
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        # a training rank's first wait that involves statistics (today: at the end of the run)
        stall = job.wait_line("waiting for the statistics server", "snapshot to reach stats")
        os.kill(pid, signal.SIGCONT)
        stopped = False
        rc = job.finish()
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        job.kill()
    out = "".join(job.seen)
    assert rc == 0, out
    # the first wait of any rank is an end-of-run wait on statistics, after training
    assert "waiting for the statistics server to take" in stall, stall

    dump = load_dump(tmp_path / "stats.h5")
    upd, test = dump.group("updates"), dump.group("test")
    servers = dump.group("servers")
    assert len(upd["time"]) > 0 and test["time"].min() > upd["time"].max(), (test, upd["time"])
    tested = set(test["epoch"].astype(int).tolist())
    skipped = set(dump.group("skipped_tests").get("epoch", np.zeros(0)).astype(int).tolist())
    assert EPOCHS in tested and tested | skipped == set(range(1, EPOCHS + 1)), (tested, skipped)
    assert not tested & skipped
    assert skipped and int(servers["skipped_snapshots"].sum()) > 0  # the queue is bounded

    dropped = dump.attrs.get("dropped_records", {})
    assert dump.attrs.get("dropped_records_total", 0) > 0, dump.attrs
    assert "dropped" in out and "statistics rows" in out
    learners, train = dump.group("learners"), dump.group("train")
    ranks = {0: 3, 1: 4, 2: 5, 3: 6}  # learner index -> rank (shard, stats, data first)
    for i, lid in enumerate(learners["learner"].tolist()):
        kept = int(np.sum(train["learner"] == lid))
        lost = dropped.get(str(ranks[lid]), {}).get("train", 0)
        assert lost > 0 and kept + lost == learners["minibatches"][i], (lid, kept, lost)


def test_snapshot_queue_is_bounded_by_bytes():
    from pserver.roles.server import SNAPSHOT_QUEUE_MAX, snapshot_queue

    assert snapshot_queue(150_000) == SNAPSHOT_QUEUE_MAX  # small models: the most
    assert snapshot_queue(16 << 20) == 4  # 4 x 16 MiB = 64 MiB
    assert snapshot_queue(1 << 30) == 1  # a large shard still queues one
