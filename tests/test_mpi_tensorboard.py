"""TensorBoard scalars and progress lines of a real run (issue 24 item 4): the event files the
statistics server wrote while the run went are read back and checked against the dump."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, run_job
from tfevents import read_scalars

from learners.data import describe_dataset
from pserver.dump.reader import load_dump
from pserver.dump.tensorboard import PATTERN, TAGS
from pserver.optim.rules import scheduled_lr
from pserver.plan.config import load_config

pytestmark = pytest.mark.mpi

TIMEOUT = 180.0
LIVE = ("stats.tensorboard=true", "stats.flush_interval=0.1", "stats.progress_every=0.1",
        "run.epochs=3")


@pytest.mark.parametrize("protocol, ranks", [("hardsync", 7), ("sync", 6)])
def test_scalars_are_the_dumps_rows(tmp_path, protocol, ranks):
    overrides = [f"run.out_dir={tmp_path}", f"protocol.name={protocol}", *LIVE]
    res = run_job(ranks, [str(QUICKSTART), *overrides], TIMEOUT)
    assert res.returncode == 0, res.output
    assert list(tmp_path.glob(PATTERN)), os.listdir(tmp_path)
    got = read_scalars(tmp_path)
    assert set(got) == set(TAGS), sorted(got)
    dump = load_dump(tmp_path / "stats.h5")
    test, train = dump.group("test"), dump.group("train")
    assert [s for s, _, _ in got["test/error"]] == [int(e) for e in test["epoch"]]
    assert np.allclose([v for _, v, _ in got["test/error"]], test["error"], rtol=1e-6)
    assert np.allclose([v for _, v, _ in got["test/loss"]], test["loss"], rtol=1e-6)
    # each point's training loss: the mean of the train rows since the previous point
    steps = [s for s, _, _ in got["train/loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == len(train["loss"]), steps
    means = [train["loss"][a:b].mean() for a, b in zip([0, *steps], steps, strict=False)]
    assert np.allclose([v for _, v, _ in got["train/loss"]], means, rtol=1e-5)
    sigma = dump.group("staleness")["staleness"]
    assert got["staleness/mean"][-1][1] == pytest.approx(sigma.mean(), rel=1e-6)
    assert got["staleness/max"][-1][1] == sigma.max()
    cfg = load_config(QUICKSTART, overrides)
    if protocol == "sync":  # no updates rows: the schedule at the epoch reached
        n_train = describe_dataset(cfg.data, cfg.run.seed).n_train
        lr = scheduled_lr(cfg.optim, steps[-1] * cfg.data.batch_size / n_train)
        assert got["train/lr"][-1][1] == pytest.approx(lr, rel=1e-6)
    else:
        assert got["train/lr"][-1][1] == pytest.approx(dump.group("updates")["lr"][-1], 1e-6)
    rates = [v for _, v, _ in got["train/samples_per_s"]]
    assert all(np.isfinite(rates)) and min(rates) > 0
    lines = [ln for ln in res.stderr.splitlines() if " test error " in ln]
    assert len(lines) == 3 and all(" ETA " in ln for ln in lines), res.output


def test_asking_for_scalars_without_tensorboardx_stops_before_training(tmp_path):
    fake = tmp_path / "fake" / "tensorboardX"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the test hides tensorboardX')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(fake.parent)])}
    res = run_job(7, [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}",
                      "stats.tensorboard=true"], TIMEOUT, env=env)
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1 and "stats.tensorboard = true needs the package tensorboardX" in (
        lines[0]), res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "run").exists()
