"""model.init_from on real mpiexec jobs: a run starts from another run's final model."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from learners.data import load_dataset
from learners.serial import train_serial
from pserver.plan.config import load_config
from tests.mpirun import QUICKSTART, final_weights, run_job, train

pytestmark = pytest.mark.mpi

SGD = ("optim.rule=sgd", "optim.lr_milestones=[]", "optim.weight_decay=0")


def test_a_warm_started_run_trains_from_the_other_runs_final_model(tmp_path):
    """λ = 1 hardsync from a 1-epoch run's model equals serial SGD from that model (not from
    the seed's), and the dump records where w0 came from."""
    a, b = tmp_path / "a", tmp_path / "b"
    train(a, 4, "run.epochs=1")
    warm = (*SGD, "run.epochs=1", "run.seed=3", f"model.init_from={a}")
    train(b, 4, *warm)
    cfg = load_config(QUICKSTART, list(warm))
    ds = load_dataset(cfg.data, cfg.run.seed)
    want = train_serial(cfg, ds, w0=final_weights(a))
    got = final_weights(b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    cold = train_serial(cfg, ds)
    assert not np.allclose(got, cold, rtol=1e-3, atol=1e-3)  # w0 was not the seed's
    with h5py.File(b / "stats.h5", "r") as f:
        assert json.loads(f.attrs["config"])["model"]["init_from"] == str(a)


def test_another_model_is_refused_on_every_rank_with_one_line(tmp_path):
    a = tmp_path / "a"
    train(a, 4, "run.epochs=1")
    res = run_job(5, [str(QUICKSTART), f"run.out_dir={tmp_path / 'b'}", "stats.progress=false",
                      "model.hidden=[32]", f"model.init_from={a}"], 120.0)  # fmt: skip
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert "model.init_from" in lines[0] and "model.hidden = [64] there, [32] here" in lines[0]
    assert not (tmp_path / "b" / "stats.h5").exists()  # refused before anything was written
