"""A warm start from ``runs/x/latest`` records the run it started from, not the link that the
next run moves (issue 24 item 6). Two short runs through ``pserver.run``, under a timeout."""

from __future__ import annotations

import json
import os

import h5py
import pytest
from mpirun import QUICKSTART, ROOT

import pserver
from pserver.job import launch

pytestmark = pytest.mark.mpi

TIMEOUT = 180
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PSERVER_MPIEXEC": launch.mpiexec_program()}


def test_init_from_latest_is_recorded_as_the_run_it_named(tmp_path):
    runs = tmp_path / "runs"
    common = {"run.epochs": 1, "stats.progress": False, "run.out_dir": f"{runs}/{{id}}"}
    source = pserver.run(QUICKSTART, 2, common, timeout=TIMEOUT, env=ENV, log=tmp_path / "1.log")
    assert source.ok, source.output
    warm = pserver.run(QUICKSTART, 2, {**common, "model.init_from": str(runs / "latest")},
                       timeout=TIMEOUT, env=ENV, log=tmp_path / "2.log")  # fmt: skip
    assert warm.ok, warm.output
    assert os.readlink(runs / "latest") == warm.directory.name  # the link has moved on
    with h5py.File(warm.dump, "r") as f:
        recorded = json.loads(f.attrs["config"])["model"]["init_from"]
    assert recorded == str(source.directory)  # not .../runs/latest
    assert f"the final model of {source.directory}" in warm.output
