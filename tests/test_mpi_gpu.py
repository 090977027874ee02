"""Real mpiexec runs with ``run.device = "gpu"``: CuPy arrays in learners, shards and aggregators.

Skipped where CuPy or a CUDA device is missing (CI); ``scripts/gpu_check.sh`` runs them on a GPU
machine. Every rank of a job shares the node's GPU(s) by local rank, as on a cluster node with
fewer GPUs than ranks. Where the MPI library is not CUDA-aware (the PyPI MPICH), every payload
goes through the pinned staging buffers; the last test hands device buffers to MPI directly and
runs only where the library says it can take them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, assert_learned, final_weights, require_gpu, train

from learners.data import load_dataset
from learners.serial import serial_steps, train_serial
from pserver.dump.reader import load_dump
from pserver.plan.config import load_config

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


@pytest.fixture(scope="module", autouse=True)
def gpu() -> None:
    require_gpu()



@pytest.mark.parametrize(
    "ranks, overrides",
    [
        (4, ("protocol.name=hardsync",)),
        (4, ("protocol.name=softsync", "optim.rule=nesterov", "blocks.count=3")),
        (5, ("protocol.name=async", "optim.rule=adagrad", "cluster.servers=2", "blocks.count=4")),
        (4, ("protocol.name=hardsync", "comm.mode=thread", "blocks.count=2")),
        (4, ("protocol.name=hardsync", "comm.mode=nonblocking", "blocks.count=2")),
        (5, ("protocol.name=hardsync", "cluster.tree_fanout=2", "blocks.count=2")),
        (4, ("protocol.name=hardsync", "model.kind=cnn", "model.channels=[4,8]")),
    ],
    ids=["hardsync", "softsync-nesterov-3-blocks", "async-adagrad-2-shards", "thread-mode",
         "nonblocking-mode", "aggregator-tree", "cnn"],
)
def test_one_learner_on_gpu_reproduces_serial_numpy_sgd(tmp_path, ranks, overrides):
    # float64: cuBLAS and OpenBLAS sum in different orders, so "equal" is to rounding only.
    common = ("run.epochs=2", "model.dtype=float64", "optim.weight_decay=0.001", *overrides)
    train(tmp_path, ranks, "run.device=gpu", *common, timeout=300)
    cfg = load_config(QUICKSTART, list(common))
    w_serial = train_serial(cfg, load_dataset(cfg.data, cfg.run.seed))
    np.testing.assert_allclose(final_weights(tmp_path), w_serial, rtol=1e-8, atol=1e-10)


def test_four_learners_hardsync_on_gpu_zero_staleness_and_accuracy(tmp_path):
    train(tmp_path, 7, "run.device=gpu", "protocol.name=hardsync", timeout=300)
    dump = load_dump(tmp_path / "stats.h5")
    g = dump.group("gradients")
    assert np.all(g["staleness"][g["update"] >= 0] == 0)
    assert np.all(dump.group("updates")["n_gradients"] == 4)
    assert_learned(dump)


@pytest.mark.parametrize("mode", ["thread", "nonblocking"])
def test_overlapped_softsync_on_gpu_trains(tmp_path, mode):
    train(
        tmp_path, 8, "run.device=gpu", f"comm.mode={mode}", "protocol.name=softsync",
        "cluster.servers=2", "blocks.count=4", "inject.compute_time=0.003", timeout=300,
    )  # fmt: skip
    dump = load_dump(tmp_path / "stats.h5")
    assert dump.group("test")["error"][-1] <= 0.10  # chance is 0.9; 20 epochs of 1-softsync
    g, u = dump.group("gradients"), dump.group("updates")
    assert g["staleness"].max() >= 1  # four learners really were in flight at once
    clocks = u["vector_clock"]
    assert np.all((clocks < u["timestamp"][:, None]) | (clocks == -1))


def test_gpu_loss_curve_matches_cpu_backend(tmp_path):
    out = tmp_path / "curves.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_backends.py"), "--models", "mlp",
         "--dtypes", "float64", "float32", "--epochs", "2", "--quiet-idle", "0",
         "--out", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = load_config(QUICKSTART, ["run.epochs=2"])
    steps = serial_steps(cfg, len(load_dataset(cfg.data, cfg.run.seed).y_train))
    for r in json.loads(out.read_text()):
        tol = 1e-9 if r["dtype"] == "float64" else 1e-3
        assert r["steps"] == steps
        assert r["loss_max_rel"] <= tol and r["weights_rel"] <= tol, r


def test_cuda_aware_path_where_the_library_is(tmp_path):
    from mpi4py import MPI

    from pserver.comm.backend import detect_cuda_aware

    if not detect_cuda_aware(MPI):
        pytest.skip(f"{MPI.Get_library_version().splitlines()[0]} is not CUDA-aware")
    common = ("run.epochs=2", "model.dtype=float64", "protocol.name=hardsync", "blocks.count=2")
    train(tmp_path, 4, "run.device=gpu", "comm.cuda_aware=yes", *common, timeout=300)
    cfg = load_config(QUICKSTART, list(common))
    w_serial = train_serial(cfg, load_dataset(cfg.data, cfg.run.seed))
    np.testing.assert_allclose(final_weights(tmp_path), w_serial, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "ranks, overrides",
    [(4, ("protocol.name=async",)),
     (5, ("protocol.name=softsync", "optim.rule=nesterov", "cluster.servers=2",
          "blocks.count=3", "protocol.predict_steps=2"))],
    ids=["async", "nesterov-2-shards-S2"],
)
def test_one_learner_ppasgd_on_gpu_reproduces_serial_numpy(tmp_path, ranks, overrides):
    """PP-ASGD's served prediction on CuPy (the staged copy is made from ``serve``)."""
    from learners.serial import train_serial_predicted

    common = ("run.epochs=2", "model.dtype=float64", "optim.weight_decay=0.001",
              "protocol.predict=true", *overrides)
    train(tmp_path, ranks, "run.device=gpu", *common, timeout=300)
    cfg = load_config(QUICKSTART, list(common))
    steps = max(cfg.protocol.predict_steps, 0)  # one blocking learner: σ = 0, measured S = 0
    w_serial = train_serial_predicted(cfg, load_dataset(cfg.data, cfg.run.seed), steps)
    np.testing.assert_allclose(final_weights(tmp_path), w_serial, rtol=1e-8, atol=1e-10)
    assert load_dump(tmp_path / "stats.h5").group("prediction_errors")
