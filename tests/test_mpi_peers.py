"""A rank that dies: the survivors name it, not themselves, and the job ends.

MPICH's launcher usually kills the whole job when one process dies, before any survivor
notices. A launcher that does not (a multi-host job, ``srun --kill-on-bad-exit=0``) is stood in
for here by a shell around each rank that outlives its Python process, so the launcher never
learns of the death: only the survivors can end the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from mpirun import QUICKSTART, ROOT, mpiexec

pytestmark = pytest.mark.mpi

TIMEOUT = 90.0
# each rank: Python in the background, its pid in a file, and a shell that stays after it dies
WRAPPER = '"$@" & echo $! > "$PIDS/${PMI_RANK:-$OMPI_COMM_WORLD_RANK}"; wait $!; exec sleep 300'


def test_killed_shard_is_named_by_the_survivors(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    cmd = [
        mpiexec(), "-n", "7", "sh", "-c", WRAPPER, "sh",
        sys.executable, "-m", "pserver.job.cli", str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}",
        "run.epochs=1000", "stats.progress=false", "inject.compute_time=0.002",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1", PIDS=str(pids)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    timer = threading.Timer(TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.daemon = True
    timer.start()
    err = []
    assert proc.stderr is not None
    for line in proc.stderr:
        err.append(line)
        if "[rank 0 server 0" in line and "serving blocks" in line:  # training has started
            os.kill(int((pids / "0").read_text()), signal.SIGKILL)
    proc.wait()
    fired = not timer.is_alive()
    timer.cancel()
    text = "".join(err)
    assert not fired, f"the survivors never ended the job:\n{text}"
    assert proc.returncode != 0
    last_words = [ln for ln in text.splitlines() if ln.startswith("pserver-run: rank")]
    assert last_words, text
    for line in last_words:  # every survivor that spoke blames rank 0, none itself
        assert "lost rank 0 (server 0, pid" in line and "it failed first" in line, text
        assert "failed; aborting" not in line
