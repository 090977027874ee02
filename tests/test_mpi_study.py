"""pserver-study end to end: two tiny jobs (two strategies, one seed, one rate), the table, the
CSV and the figures; run again, it runs nothing new. Under a hard timeout."""

from __future__ import annotations

import csv
import os
import sys

import pytest
from mpirun import QUICKSTART, ROOT

from pserver.job import launch

pytestmark = pytest.mark.mpi

STUDY = f"""
[study]
config = "{QUICKSTART}"
learners = 2
seeds = 1
lr = [0.1]
target = 0.5
timeout = 60
overrides = ["run.epochs=1", "optim.lr_milestones=[]"]

[strategies.hardsync]
[strategies.sync]
"""


def study(path, out):
    cmd = [sys.executable, "-m", "pserver.job.study", str(path), "--out", str(out)]
    res = launch.run(cmd, 150, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=ROOT)
    assert not res.reason and res.returncode == 0, res.output
    return res.output


def test_quick_study_writes_its_outputs_and_resumes(tmp_path):
    path, out = tmp_path / "study.toml", tmp_path / "out"
    path.write_text(STUDY)
    first = study(path, out)
    assert "hardsync/final-lr0.1-seed0: mpiexec -n 5" in first  # 1 shard + stats + data + 2
    assert "sync/final-lr0.1-seed0: mpiexec -n 4" in first  # learners only
    with open(out / "study.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"hardsync", "sync"}
    for r in rows.values():
        assert 0 <= float(r["final_error_mean"]) < 0.5 and float(r["samples_per_s_mean"]) > 0
    for name in ("table.md", "runs.csv", "error_vs_time.png", "error_vs_samples.png"):
        assert (out / name).stat().st_size > 0
    again = study(path, out)
    assert "mpiexec" not in again and again.count("finished before, not run again") == 2
