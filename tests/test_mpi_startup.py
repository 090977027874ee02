"""Start-up: a failure of any kind on some ranks only ends the job with one line, never a hang.

Faults are injected from outside pserver (``tests/faults/sitecustomize.py``, on PYTHONPATH)
into the HDF5 read of one rank, as a node with less memory or a flaky file system would fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, run_job

from learners.data import write_hdf5_dataset
from pserver.job import launch

pytestmark = pytest.mark.mpi

FAULTS = Path(__file__).resolve().parent / "faults"
TIMEOUT = 60.0


def data_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "data.h5"
    write_hdf5_dataset(path, rng.normal(size=(200, 8)).astype(np.float32), np.arange(200) % 4)
    return path


def start(n: int, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    # the launcher with $PSERVER_MPIEXEC_FLAGS (Open MPI as root needs --allow-run-as-root)
    cmd = launch.mpi_command(n, [*launch.pserver_cli(), *args])
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def watchdog(proc: subprocess.Popen, timeout: float = TIMEOUT) -> threading.Timer:
    """Kill the whole job after ``timeout`` seconds: a hang fails the test, never blocks it."""
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.daemon = True
    timer.start()
    return timer


def finish(proc: subprocess.Popen, timer: threading.Timer, err_lines: list[str]) -> str:
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait()
    hung = not timer.is_alive()  # the watchdog fired
    timer.cancel()
    text = out + "".join(err_lines)
    assert not hung, f"the job hung for {TIMEOUT:.0f} s and was killed:\n{text}"
    return text


def errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("pserver-run: error:")]


def test_memory_error_on_one_rank_ends_the_job_with_one_line(tmp_path):
    """A MemoryError (not a PserverError) on rank 4 only: before the fix, rank 4 died alone
    and the six others waited forever in a blocking Allgather."""
    data = data_file(tmp_path)
    args = [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", "data.source=hdf5",
            f"data.path={data}"]
    proc = start(7, args, {"PSERVER_TEST_FAULT": "4:memory"})
    timer = watchdog(proc)
    err = proc.stderr.readlines() if proc.stderr else []
    text = finish(proc, timer, err)
    assert proc.returncode != 0, text
    lines = errors(text)
    assert len(lines) == 1, text
    assert "rank 4 of 7" in lines[0] and "MemoryError: injected on rank 4" in lines[0], text
    assert "Traceback" not in text
    assert not (tmp_path / "run" / "stats.h5").exists()


def test_rank_stuck_while_preparing_leaves_the_others_reporting_not_spinning(tmp_path):
    """Rank 4's file system hangs: the others wait in the agreement with back-off and report
    the stall; once rank 4's read fails, the job ends with its one line."""
    data = data_file(tmp_path)
    release = tmp_path / "release"
    args = [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", "data.source=hdf5",
            f"data.path={data}", "comm.stall_timeout=0.2"]
    env = {"PSERVER_TEST_FAULT": "4:hang", "PSERVER_TEST_RELEASE": str(release)}
    proc = start(7, args, env)
    timer = watchdog(proc)
    err: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        err.append(line)
        if "stalled" in line and "every rank to finish preparing" in line:
            release.touch()  # the report came: let rank 4's read fail now
    text = finish(proc, timer, err)
    assert release.exists(), f"no rank reported the stall:\n{text}"
    assert proc.returncode == 2, text
    lines = errors(text)
    assert len(lines) == 1 and "injected on rank 4" in lines[0] and "(on rank 4 of 7)" in lines[0]


def test_usage_error_is_printed_once(tmp_path):
    res = run_job(4, [], timeout=TIMEOUT)
    assert res.returncode == 2
    assert res.stderr.count("usage: pserver-run") == 1, res.stderr
    assert res.stderr.count("the following arguments are required: config") == 1


def test_config_path_that_is_a_directory_says_so(tmp_path):
    res = run_job(4, [str(tmp_path)], timeout=TIMEOUT)
    assert res.returncode == 2
    lines = errors(res.stderr)
    assert len(lines) == 1 and "is a directory" in lines[0], res.stderr
