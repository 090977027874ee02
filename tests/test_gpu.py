"""The models and the host staging on a real CUDA device, checked against numpy.

Every test here is marked ``gpu`` and skipped where CuPy or a device is missing; run them with
``pytest -m gpu`` (``scripts/gpu_check.sh`` does, on a GPU machine). The other GPU checks live
next to the code they test and run under the same marker:

* the fused update kernels against the numpy rules: ``tests/test_backend.py::
  test_cupy_kernels_match_numpy`` (every rule, float32 and float64);
* a single-block staging round trip: ``tests/test_backend.py::test_staging_round_trip_on_gpu``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from learners.cnn import build_cnn
from learners.data import BatchSampler, load_dataset
from learners.models import build_model
from pserver.comm.backend import StagingBuffers, select_backend
from pserver.errors import BackendError
from pserver.plan.config import DataConfig, ModelConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp() -> ModuleType:
    """CuPy with at least one visible device, or a skip saying what is missing."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install failing inside the import
        pytest.skip(f"CuPy cannot be imported: {e}")
    try:
        n_devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver or no device
        pytest.skip(f"CuPy sees no CUDA device: {e}")
    if n_devices < 1:
        pytest.skip("no CUDA device is visible")
    return cupy


def make(kind: str, dtype: str, xp: Any, n_features: int = 64, n_classes: int = 10) -> Any:
    """The same architecture on either backend (small channels keep float32 pooling ties rare)."""
    cfg = ModelConfig(kind=kind, hidden=[48, 32], dtype=dtype)
    if kind == "cnn":
        cfg.channels = [8, 16]
        return build_cnn(cfg, n_features, n_classes, xp)
    return build_model(cfg, n_features, n_classes, xp)


def batch(n: int = 32, f: int = 64, c: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, f)).astype(np.float32), rng.integers(0, c, size=n)


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """float64: element-wise to 1e-10; float32: to 1e-4 of the vector's norm.

    In float32 the GPU sums in another order, and a pooling window whose two largest values
    differ by a rounding error may pick another winner: a few entries move, the vector barely.
    """
    if dtype == "float64":
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    else:
        assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["softmax", "mlp", "cnn"])
def test_loss_and_gradient_on_cupy_match_numpy(cp: ModuleType, kind: str, dtype: str) -> None:
    host, dev = make(kind, dtype, np), make(kind, dtype, cp)
    X, y = batch()
    w = host.init_params(0) + np.random.default_rng(1).normal(0, 0.05, host.n_params)
    w = w.astype(dtype)
    g_host = np.empty_like(w)
    loss_h, err_h = host.loss_grad(w, X, y, g_host)

    w_dev, X_dev, y_dev = cp.asarray(w), cp.asarray(X), cp.asarray(y)
    g_dev = cp.full(w.shape, cp.nan, dtype=dtype)
    ptr = g_dev.data.ptr
    loss_d, err_d = dev.loss_grad(w_dev, X_dev, y_dev, g_dev)

    assert g_dev.data.ptr == ptr and g_dev.dtype == dtype  # written in place, on the device
    assert type(loss_d) is float and type(err_d) is float
    assert loss_d == pytest.approx(loss_h, rel=1e-10 if dtype == "float64" else 1e-5)
    assert abs(err_d - err_h) <= 1 / len(y)  # a near-tie of two logits may flip in float32
    assert_close(cp.asnumpy(g_dev), g_host, dtype)
    ev_h, ev_d = host.evaluate(w, X, y, batch=10), dev.evaluate(w_dev, X_dev, y_dev, batch=10)
    assert ev_d[0] == pytest.approx(ev_h[0], rel=1e-10 if dtype == "float64" else 1e-5)


def test_cnn_runs_on_the_device(cp: ModuleType) -> None:
    # The GPU path must not bounce through the host: every intermediate is a CuPy array.
    dev = make("cnn", "float32", cp)
    X, _ = batch(n=4)
    logits, cache = dev.forward(dev.views(cp.asarray(dev.init_params(0))), cp.asarray(X))
    assert isinstance(logits, cp.ndarray)
    assert all(isinstance(a, cp.ndarray) for a in cache)


def test_cnn_sgd_on_cupy_tracks_numpy(cp: ModuleType) -> None:
    pytest.importorskip("sklearn")  # the digits; a GPU machine may lack scikit-learn
    ds = load_dataset(DataConfig(source="digits"), seed=0)
    host, dev = make("cnn", "float64", np), make("cnn", "float64", cp)
    w = host.init_params(0)
    w_dev = cp.asarray(w)
    g, g_dev = np.empty_like(w), cp.empty_like(w_dev)
    sampler = BatchSampler(len(ds.y_train), 32, seed=0)
    for _ in range(10):
        idx = sampler.next()
        X, y = ds.X_train[idx], ds.y_train[idx]
        host.loss_grad(w, X, y, g)
        dev.loss_grad(w_dev, cp.asarray(X), cp.asarray(y), g_dev)
        w -= 0.1 * g
        w_dev -= 0.1 * g_dev
    np.testing.assert_allclose(cp.asnumpy(w_dev), w, rtol=1e-9, atol=1e-11)


def test_staging_per_layer_blocks_after_work_on_another_stream(cp: ModuleType) -> None:
    # A learner computes its gradient on whatever stream is current, then stages one block per
    # layer into pinned mirrors: the copies must wait for that stream's kernels.
    try:
        backend = select_backend("gpu", local_rank=0, local_size=1, cuda_aware="no")
    except BackendError as e:
        pytest.skip(str(e))
    host, dev = make("cnn", "float64", np), make("cnn", "float64", cp)
    X, y = batch()
    w = host.init_params(3)
    g_host = np.empty_like(w)
    host.loss_grad(w, X, y, g_host)
    staging = StagingBuffers(backend, dev.layer_sizes, np.float64)
    bounds = list(zip(dev.offsets[:-1], dev.offsets[1:], strict=True))
    mirrors = [staging.host(k) for k in range(len(bounds))]
    with cp.cuda.Stream(non_blocking=True):
        g_dev = cp.empty(dev.n_params, dtype=cp.float64)
        dev.loss_grad(cp.asarray(w), cp.asarray(X), cp.asarray(y), g_dev)
        for k, (a, e) in enumerate(bounds):
            out = staging.to_host(k, g_dev[a:e])
            assert out is mirrors[k]  # the same pinned buffer every time
            assert_close(out, g_host[a:e], "float64")
        for k, (a, e) in enumerate(bounds):
            mirrors[k][:] = k + 1  # as if MPI had received new values
            staging.from_host(k, g_dev[a:e])
        expected = np.repeat(np.arange(1, len(bounds) + 1.0), dev.layer_sizes)
        np.testing.assert_array_equal(cp.asnumpy(g_dev), expected)
