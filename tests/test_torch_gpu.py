"""The PyTorch adapter on a GPU: CuPy buffers shared with PyTorch through DLPack.

Skipped where CuPy, a CUDA device or a CUDA build of PyTorch is missing (CI; the ``[torch]``
extra is the CPU build); ``scripts/gpu_check.sh`` runs it on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import ROOT, train

from pserver.plan.config import load_config

pytestmark = pytest.mark.gpu

CNN = f"{ROOT / 'examples' / 'torch_cnn.py'}:build"


@pytest.fixture(scope="module")
def cupy():
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device is visible")
    except Exception as e:  # CUDARuntimeError: no driver or no device
        pytest.skip(f"CuPy sees no CUDA device: {e}")
    if not torch.cuda.is_available():
        pytest.skip(f"PyTorch {torch.__version__} is built without CUDA")
    return cp


def models(cupy, dtype="float64"):
    from learners.factory import build_model

    cfg = load_config(None, ["model.kind=torch", f"model.module={CNN}", f"model.dtype={dtype}"])
    return build_model(cfg.model, 64, 10, np), build_model(cfg.model, 64, 10, cupy)


def test_cupy_buffers_are_the_parameters_and_gradients(cupy):
    host, dev = models(cupy)
    w = host.init_params(0)
    rng = np.random.default_rng(0)
    X, y = rng.random((16, 64), dtype=np.float32), rng.integers(0, 10, 16).astype(np.int64)
    g = np.empty_like(w)
    loss, err = host.loss_grad(w, X, y, g)
    w_d, g_d = cupy.asarray(w), cupy.full(w.size, cupy.nan)
    w2_d = cupy.asarray(host.init_params(1))
    X_d, y_d = cupy.asarray(X), cupy.asarray(y)
    for _ in range(2):  # alternating buffers, as a learner's pulls swap them
        loss_d, err_d = dev.loss_grad(w_d, X_d, y_d, g_d)
        dev.loss_grad(w2_d, X_d, y_d, cupy.empty_like(g_d))
    cupy.cuda.get_current_stream().synchronize()
    dev.loss_grad(w_d, X_d, y_d, g_d)
    for p in dev.params:
        assert p.is_cuda
        assert w_d.data.ptr <= p.data_ptr() < w_d.data.ptr + w_d.nbytes
        assert g_d.data.ptr <= p.grad.data_ptr() < g_d.data.ptr + g_d.nbytes
    np.testing.assert_allclose(cupy.asnumpy(g_d), g, rtol=1e-9, atol=1e-11)
    assert loss_d == pytest.approx(loss, rel=1e-9) and err_d == err
    w_d[:] = 0  # writing the CuPy buffer is writing the module
    assert all(float(p.detach().abs().sum()) == 0.0 for p in dev.params)


@pytest.mark.mpi
def test_a_gpu_run_of_a_torch_module_learns(cupy, tmp_path):
    train(tmp_path, 5, "run.device=gpu", "model.kind=torch", f"model.module={CNN}",
          "run.epochs=3", "optim.lr_milestones=[]", timeout=300.0)
    import h5py

    with h5py.File(tmp_path / "stats.h5", "r") as f:
        assert f["test/error"][-1] < 0.15
