"""ADPSGD (protocol.name = "adpsgd") on real runs: bad input refused before training."""

from __future__ import annotations

import pytest
from mpirun import run_job

pytestmark = pytest.mark.mpi

CONFIG = """
[run]
seed = 0
epochs = 1
[protocol]
name = "adpsgd"
[cluster]
servers = 0
[model]
kind = "mlp"
hidden = [16]
[data]
source = "digits"
batch_size = 16
"""


def write_config(tmp_path):  # noqa: ANN001, ANN201 - Path -> Path
    path = tmp_path / "adpsgd.toml"
    path.write_text(CONFIG)
    return path


def test_one_learner_is_refused_on_every_rank(tmp_path):
    res = run_job(3, [str(write_config(tmp_path)), f"run.out_dir={tmp_path / 'out'}"], 120)
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1, res.output
    assert "'adpsgd' needs at least 2 learners, this run has 1" in lines[0]
    assert "Traceback" not in res.output


def test_server_shards_are_refused(tmp_path):
    args = [str(write_config(tmp_path)), f"run.out_dir={tmp_path / 'out'}", "cluster.servers=1"]
    res = run_job(5, args, 120)
    assert res.returncode == 2, res.output
    assert "runs without parameter-server shards; set cluster.servers = 0" in res.stderr
    assert "Traceback" not in res.output
