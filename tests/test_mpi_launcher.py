"""``pserver-launch`` and ``pserver.run`` end to end: λ learners under a strategy with shards
and one without, the API's Run against ``pserver-stats summary --json``, and a SIGTERM passed
through the launcher to a run that checkpoints. Every job under a hard timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT

import pserver
from pserver.dump.reader import load_dump
from pserver.job import launch

pytestmark = pytest.mark.mpi

TIMEOUT = 180  # seconds for one job, start-up on a loaded 2-core machine included
# the launcher named, so that a run inside a SLURM allocation tests the same thing
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PSERVER_MPIEXEC": launch.mpiexec_program()}


def launch_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pserver.job.launcher", "--timeout", str(TIMEOUT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=TIMEOUT + 2 * 60)  # fmt: skip


@pytest.mark.parametrize(("protocol", "ranks"), [("sync", 6), ("hardsync", 7)])
def test_launch_runs_the_learners_asked_for(tmp_path, protocol, ranks):
    res = launch_cli(str(QUICKSTART), "--learners", "4", f"protocol.name={protocol}",
                     "run.epochs=1", f"run.out_dir={tmp_path}", "stats.progress=false")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"-n {ranks} " in res.stderr  # the command it ran, printed first
    dump = load_dump(tmp_path / "stats.h5")
    assert sorted(set(dump.group("train")["learner"].tolist())) == [0, 1, 2, 3]
    assert dump.attrs["world_size"] == ranks and dump.attrs["protocol"] == protocol


def summary_json(run: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "pserver.stats.cli", "summary", "--json", str(run)],
                         capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_the_python_api_runs_and_opens_a_run(tmp_path):
    d = tmp_path / "fixed"
    over = {"run.epochs": 2, "run.out_dir": str(d), "stats.progress": False}
    r = pserver.run(QUICKSTART, learners=2, overrides=over, timeout=TIMEOUT, env=ENV,
                    log=tmp_path / "log")  # fmt: skip
    assert r.ok and r.returncode == 0 and r.directory == d.resolve(), r.output
    assert "-n 5 " in r.command and "run.epochs=2" in r.output.splitlines()[0]
    s = r.summary()
    assert s == summary_json(d) and s["run"]["n_learners"] == 2
    frames = r.frames()
    assert isinstance(frames, dict) and frames and {"train", "test"} <= set(frames)
    import pandas as pd

    assert all(isinstance(f, pd.DataFrame) for f in frames.values())
    assert len(frames["test"]) == 2  # one test per epoch
    assert np.array_equal(frames["test"]["error"], load_dump(d / "stats.h5").group("test")["error"])
    opened = pserver.open_run(d)
    assert opened.summary() == s and opened.ok and opened.returncode is None


def test_a_templated_run_directory_is_the_run_not_latest(tmp_path):
    runs = tmp_path / "runs"
    over = {"run.epochs": 1, "run.out_dir": f"{runs}/{{id}}", "stats.progress": False,
            "protocol.name": "adpsgd"}  # fmt: skip
    first = pserver.run(QUICKSTART, 2, over, timeout=TIMEOUT, env=ENV, log=tmp_path / "1.log")
    second = pserver.run(QUICKSTART, 2, over, timeout=TIMEOUT, env=ENV, log=tmp_path / "2.log")
    assert first.ok and second.ok, first.output + second.output
    assert first.directory != second.directory  # each call a run id of its own
    for r in (first, second):
        assert r.directory.parent == runs.resolve() and r.directory.name != "latest"
        assert (r.directory / "stats.h5").is_file()
    assert pserver.open_run(runs).directory == second.directory  # `latest`, followed
    assert pserver.open_run(runs / "latest").summary() == second.summary()


def test_sigterm_to_the_launcher_checkpoints_the_run(tmp_path):
    cmd = [sys.executable, "-m", "pserver.job.launcher", str(QUICKSTART), "--learners", "2",
           "run.epochs=1000", f"run.out_dir={tmp_path}", "--timeout", str(TIMEOUT)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    seen = []
    try:
        for line in proc.stdout:  # the first progress line: training is under way
            seen.append(line)
            if "epoch 1/1000" in line:
                break
        else:
            pytest.fail("no progress line:\n" + "".join(seen))
        proc.send_signal(signal.SIGTERM)  # the launcher alone, as a scheduler or a user would
        rest, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(seen) + rest
    assert proc.returncode == 75, out  # stopped with its checkpoint (docs/checkpoints.md)
    assert "passing SIGTERM to the job" in out and "got SIGTERM; exit status 75" in out
    assert (tmp_path / "checkpoint" / "LATEST").is_file()
