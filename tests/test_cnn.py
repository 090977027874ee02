"""The convolutional model: exact gradients, learning, determinism, flat layout, config errors."""

from __future__ import annotations

import numpy as np
import pytest

from learners.cnn import CNN, DEFAULT_CHANNELS, build_cnn, col2im, im2col, max_pool, max_unpool
from learners.data import BatchSampler, load_dataset
from pserver.errors import ConfigError
from pserver.plan.config import CHOICES, DataConfig, ModelConfig


def toy(n: int = 4, side: int = 4, c: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, side * side)).astype(np.float32), rng.integers(0, c, size=n)


def cnn_config(channels: list[int] | None = None, dtype: str = "float64") -> ModelConfig:
    cfg = ModelConfig(kind="cnn", dtype=dtype)
    if channels is not None:
        cfg.channels = channels  # works before and after ModelConfig grows the field
    return cfg


@pytest.mark.parametrize("side", [4, 5])  # 5: the pooling crops the last row and column
def test_gradient_matches_central_differences(side: int) -> None:
    m = CNN(side, 3, channels=(2, 3), dtype="float64")
    X, y = toy(side=side)
    rng = np.random.default_rng(2)
    w = m.init_params(1) + rng.normal(0, 0.1, m.n_params)  # nonzero biases
    grad = np.empty_like(w)
    m.loss_grad(w, X, y, grad)
    numeric, scratch = np.empty_like(w), np.empty_like(w)
    eps = 1e-6
    for i in range(m.n_params):
        wp, wm = w.copy(), w.copy()
        wp[i] += eps
        wm[i] -= eps
        numeric[i] = m.loss_grad(wp, X, y, scratch)[0] - m.loss_grad(wm, X, y, scratch)[0]
    numeric /= 2 * eps
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


def test_im2col_is_a_zero_padded_3x3_convolution() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 5, 3))
    K = rng.normal(size=(3, 3, 3, 4))  # [dy, dx, in, out]: the row order of W1/W2
    got = (im2col(np, x) @ K.reshape(27, 4)).reshape(2, 5, 5, 4)
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.zeros((2, 5, 5, 4))
    for i in range(5):
        for j in range(5):
            want[:, i, j] = np.einsum("nabc,abcd->nd", padded[:, i : i + 3, j : j + 3], K)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_col2im_is_the_adjoint_of_im2col() -> None:
    # <im2col(x), c> == <x, col2im(c)> for every x and c: the backward pass is exact.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 4, 3, 2))
    c = rng.normal(size=(2 * 4 * 3, 9 * 2))
    lhs = np.sum(im2col(np, x) * c)
    rhs = np.sum(x * col2im(np, c, x.shape))
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_max_pool_crops_odd_edges_and_routes_gradient_to_the_winner() -> None:
    a = np.arange(25, dtype=np.float64).reshape(1, 5, 5, 1)
    out, arg = max_pool(np, a)
    assert out[0, :, :, 0].tolist() == [[6, 8], [16, 18]]  # bottom-right of each window
    assert arg.ravel().tolist() == [3, 3, 3, 3]
    back = max_unpool(np, np.ones_like(out), arg, a.shape)[0, :, :, 0]
    assert back.shape == (5, 5) and back.sum() == 4
    assert [tuple(ij) for ij in np.argwhere(back)] == [(1, 1), (1, 3), (3, 1), (3, 3)]


def test_sgd_on_digits_lowers_the_loss() -> None:
    ds = load_dataset(DataConfig(source="digits"), seed=0)
    m = build_cnn(cnn_config([8, 16], "float32"), ds.n_features, ds.n_classes)
    w = m.init_params(0)
    grad = np.empty_like(w)
    before = m.evaluate(w, ds.X_train, ds.y_train)
    sampler = BatchSampler(len(ds.y_train), 32, seed=0)
    for _ in range(40):
        idx = sampler.next()
        m.loss_grad(w, ds.X_train[idx], ds.y_train[idx], grad)
        w -= 0.1 * grad
    after = m.evaluate(w, ds.X_train, ds.y_train)
    assert after[0] < 0.5 * before[0]
    assert after[1] < 0.5 * before[1]


def test_same_seed_and_data_give_bitwise_equal_results() -> None:
    X, y = toy(n=20, side=6)
    runs = []
    for _ in range(2):
        m = CNN(6, 3, channels=(4, 5), dtype="float32")
        w = m.init_params(7)
        grad = np.empty_like(w)
        out = m.loss_grad(w, X, y, grad)
        runs.append((w, grad, out, m.evaluate(w, X, y, batch=7)))
    (w1, g1, o1, e1), (w2, g2, o2, e2) = runs
    assert np.array_equal(w1, w2) and np.array_equal(g1, g2)
    assert o1 == o2 and e1 == e2
    assert not np.array_equal(w1, CNN(6, 3, channels=(4, 5), dtype="float32").init_params(8))


def test_layer_sizes_cut_the_flat_vector() -> None:
    m = CNN(8, 10)  # digits with the default channels
    c1, c2 = DEFAULT_CHANNELS
    assert m.layer_sizes == [9 * c1, c1, 9 * c1 * c2, c2, 4 * 4 * c2 * 10, 10]
    assert sum(m.layer_sizes) == m.n_params
    odd = CNN(5, 3, channels=(2, 3))  # pooled to 2x2
    assert odd.layer_sizes == [18, 2, 54, 3, 2 * 2 * 3 * 3, 3]
    assert sum(odd.layer_sizes) == odd.n_params


def test_init_is_host_vector_of_config_dtype_with_zero_biases() -> None:
    for dtype in ("float32", "float64"):
        m = CNN(4, 3, channels=(2, 3), dtype=dtype)
        w = m.init_params(0)
        assert isinstance(w, np.ndarray) and w.dtype == dtype and w.shape == (m.n_params,)
        views = m.views(w)
        for W, b in zip(views[::2], views[1::2], strict=True):
            assert not b.any() and W.std() > 0
            assert np.shares_memory(W, w)


def test_grad_is_filled_in_place() -> None:
    m = CNN(4, 3, channels=(2, 3), dtype="float32")
    X, y = toy()
    w = m.init_params(0)
    grad = np.full_like(w, np.nan)
    ident, ptr = id(grad), grad.ctypes.data
    loss, err = m.loss_grad(w, X, y, grad)
    assert id(grad) == ident and grad.ctypes.data == ptr
    assert grad.dtype == np.float32 and np.isfinite(grad).all()
    assert type(loss) is float and type(err) is float and 0.0 <= err <= 1.0


def test_evaluate_in_chunks_matches_one_batch() -> None:
    m = CNN(4, 3, channels=(2, 3), dtype="float64")
    X, y = toy(n=23)
    w = m.init_params(3)
    whole = m.loss_grad(w, X, y, np.empty_like(w))
    assert m.evaluate(w, X, y, batch=5) == pytest.approx(whole, rel=1e-12)


def test_build_cnn_reads_channels_and_defaults() -> None:
    m = build_cnn(cnn_config([2, 3]), 16, 4)
    assert (m.side, m.pooled, m.channels, m.dtype) == (4, 2, (2, 3), np.float64)
    default = build_cnn(ModelConfig(kind="cnn"), 64, 10)
    assert default.channels == DEFAULT_CHANNELS and default.dtype == np.float32


@pytest.mark.parametrize(
    "cfg, n_features, n_classes, fragment",
    [
        (cnn_config(), 65, 10, "square single-channel"),
        (cnn_config(), 1, 10, "n_features = 1"),
        (cnn_config([0, 3]), 16, 3, r"model.channels = \[0, 3\]"),
        (cnn_config([4]), 16, 3, "two positive filter counts"),
        (cnn_config(dtype="float16"), 16, 3, "model.dtype = 'float16'"),
        (cnn_config(), 16, 1, ">= 2 classes"),
    ],
)
def test_bad_cnn_config_raises(cfg, n_features: int, n_classes: int, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        build_cnn(cfg, n_features, n_classes)


def test_rejects_inputs_of_the_wrong_size() -> None:
    m = CNN(4, 3, channels=(2, 3))
    w = m.init_params(0)
    with pytest.raises(ValueError, match=r"\[N, 16\]"):
        m.loss_grad(w, np.zeros((2, 9)), np.zeros(2, dtype=np.int64), np.empty_like(w))


def test_build_model_dispatches_to_the_cnn() -> None:
    if "cnn" not in CHOICES["model.kind"]:
        pytest.skip('model.kind = "cnn" is not wired into config/build_model yet')
    from learners.models import build_model

    m = build_model(cnn_config([2, 3]), 16, 3)
    assert isinstance(m, CNN) and m.channels == (2, 3)
