"""A run never destroys an old one; the dump says which code, libraries and hosts made it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from mpirun import QUICKSTART, run_job

from pserver.dump.reader import load_dump

pytestmark = pytest.mark.mpi


def quick(cwd, *extra, env=None):
    args = [str(QUICKSTART), "run.epochs=1", "stats.progress=false", *extra]
    res = run_job(4, args, timeout=90, cwd=cwd, env=env)
    assert res.returncode == 0, res.output
    return res


def test_the_same_command_twice_keeps_both_runs_and_links_the_latest(tmp_path):
    first = quick(tmp_path, env={"PSERVER_RUN_ID": "one"})
    quick(tmp_path, env={"PSERVER_RUN_ID": "two"})
    runs = tmp_path / "runs" / "quickstart"
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "one", "two"]
    assert os.readlink(runs / "latest") == "two"
    for rid in ("one", "two"):
        assert load_dump(runs / rid / "stats.h5").attrs["run_dir"] == f"runs/quickstart/{rid}"
    # the start-up log: the layout in one line (issue 25), and one line per host with every
    # rank's role and PID, which is how the launcher names a rank it saw die (issue 22, D5)
    line = "layout: hardsync, λ = 1 learner (rank 3), 1 shard (rank 0), stats rank 1"
    assert line in first.output
    table = f"host {socket.gethostname()}: 4 ranks"
    hosts = [ln for ln in first.output.splitlines() if table in ln]
    assert len(hosts) == 1 and hosts[0].count("(pid ") == 4, first.output
    stats = subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "check", str(runs)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # the run `latest` pointed at, named as itself (issue 24 item 6)
    assert stats.returncode == 0 and f"{runs}/two/stats.h5: consistent" in stats.stdout, stats


def test_without_an_id_every_rank_agrees_on_rank_0s_start_time(tmp_path):
    env = {"PSERVER_RUN_ID": "", "SLURM_JOB_ID": ""}
    quick(tmp_path, env=env)
    made = [p for p in (tmp_path / "runs" / "quickstart").iterdir() if p.name != "latest"]
    assert len(made) == 1 and (made[0] / "stats.h5").is_file()  # one directory, not four


def test_the_dump_records_code_libraries_and_every_rank(tmp_path):
    quick(tmp_path, "run.out_dir=out", env={"SLURM_RESTART_COUNT": "2", "SLURM_JOB_ID": "9"})
    a = load_dump(tmp_path / "out" / "stats.h5").attrs
    import h5py
    import mpi4py
    import numpy as np
    from mpi4py import MPI

    assert a["versions"]["numpy"] == np.__version__ and a["versions"]["h5py"] == h5py.__version__
    assert a["versions"]["mpi4py"] == mpi4py.__version__
    assert a["mpi_library"].split()[0] == MPI.Get_library_version().split()[0]
    assert len(a["git_commit"]) >= 40  # the tests run from a checkout
    assert [r["role"] for r in a["ranks"]] == ["server 0", "stats server", "data server",
                                               "learner 0"]  # fmt: skip
    assert {r["host"] for r in a["ranks"]} == {socket.gethostname()}
    assert [r["local_rank"] for r in a["ranks"]] == [0, 1, 2, 3]
    assert a["restarts"] == 2 and a["launch"]["SLURM_JOB_ID"] == "9"
