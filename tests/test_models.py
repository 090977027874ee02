import numpy as np
import pytest

from learners.data import BatchSampler, load_dataset
from learners.models import MLP, Softmax, build_model
from pserver.errors import ConfigError
from pserver.plan.config import DataConfig, ModelConfig


def toy(n=12, f=5, c=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, f)).astype(np.float32), rng.integers(0, c, size=n)


def make(kind, dtype="float64", f=5, c=3):
    return build_model(ModelConfig(kind=kind, hidden=[6, 4], dtype=dtype), f, c)


@pytest.mark.parametrize("kind", ["softmax", "mlp"])
def test_gradient_matches_central_differences(kind):
    m = make(kind)
    X, y = toy()
    w = m.init_params(1) + np.random.default_rng(2).normal(0, 0.1, m.n_params)  # nonzero biases
    grad = np.empty_like(w)
    m.loss_grad(w, X, y, grad)
    numeric = np.empty_like(w)
    scratch = np.empty_like(w)
    eps = 1e-6
    for i in range(m.n_params):
        wp, wm = w.copy(), w.copy()
        wp[i] += eps
        wm[i] -= eps
        numeric[i] = m.loss_grad(wp, X, y, scratch)[0] - m.loss_grad(wm, X, y, scratch)[0]
    numeric /= 2 * eps
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind", ["softmax", "mlp"])
def test_sgd_on_digits_lowers_the_loss(kind):
    ds = load_dataset(DataConfig(source="digits"), seed=0)
    m = build_model(ModelConfig(kind=kind, hidden=[32]), ds.n_features, ds.n_classes)
    w = m.init_params(0)
    grad = np.empty_like(w)
    before = m.evaluate(w, ds.X_train, ds.y_train)
    sampler = BatchSampler(len(ds.y_train), 32, seed=0)
    for _ in range(50):
        idx = sampler.next()
        m.loss_grad(w, ds.X_train[idx], ds.y_train[idx], grad)
        w -= 0.2 * grad
    after = m.evaluate(w, ds.X_train, ds.y_train)
    assert after[0] < 0.7 * before[0]
    assert after[1] < 0.5 * before[1]


@pytest.mark.parametrize("kind", ["softmax", "mlp"])
def test_same_seed_and_data_give_bitwise_equal_results(kind):
    X, y = toy(n=40)
    runs = []
    for _ in range(2):
        m = make(kind, dtype="float32")
        w = m.init_params(7)
        grad = np.empty_like(w)
        out = m.loss_grad(w, X, y, grad)
        runs.append((w, grad, out, m.evaluate(w, X, y, batch=16)))
    (w1, g1, o1, e1), (w2, g2, o2, e2) = runs
    assert np.array_equal(w1, w2) and np.array_equal(g1, g2)
    assert o1 == o2 and e1 == e2
    assert not np.array_equal(w1, make(kind, dtype="float32").init_params(8))


def test_layer_sizes_cut_the_flat_vector():
    m = make("mlp")
    assert m.layer_sizes == [5 * 6, 6, 6 * 4, 4, 4 * 3, 3]
    assert sum(m.layer_sizes) == m.n_params
    s = make("softmax")
    assert s.layer_sizes == [5 * 3, 3] and sum(s.layer_sizes) == s.n_params
    assert isinstance(s, Softmax) and isinstance(m, MLP)


def test_init_is_host_vector_of_config_dtype_with_zero_biases():
    for dtype in ("float32", "float64"):
        m = make("mlp", dtype=dtype)
        w = m.init_params(0)
        assert isinstance(w, np.ndarray) and w.dtype == dtype and w.shape == (m.n_params,)
        for W, b in m.views(w):
            assert not b.any() and W.std() > 0
            assert np.shares_memory(W, w)


@pytest.mark.parametrize("kind", ["softmax", "mlp"])
def test_grad_is_filled_in_place(kind):
    m = make(kind, dtype="float32")
    X, y = toy()
    w = m.init_params(0)
    grad = np.full_like(w, np.nan)
    ident, ptr = id(grad), grad.ctypes.data
    loss, err = m.loss_grad(w, X, y, grad)
    assert id(grad) == ident and grad.ctypes.data == ptr
    assert grad.dtype == np.float32 and np.isfinite(grad).all()
    assert type(loss) is float and type(err) is float and 0.0 <= err <= 1.0


def test_evaluate_in_chunks_matches_one_batch():
    m = make("mlp")
    X, y = toy(n=50)
    w = m.init_params(3)
    whole = m.loss_grad(w, X, y, np.empty_like(w))
    chunked = m.evaluate(w, X, y, batch=7)
    assert chunked == pytest.approx(whole, rel=1e-12)


def test_softmax_is_stable_for_huge_logits():
    m = make("softmax")
    X, _ = toy()
    w = m.init_params(0) * 1e4
    loss, _ = m.loss_grad(w, X * 100, np.zeros(len(X), dtype=np.int64), np.empty_like(w))
    assert np.isfinite(loss)


@pytest.mark.parametrize(
    "cfg, fragment",
    [
        (ModelConfig(kind="resnet"), "model.kind = 'resnet'"),
        (ModelConfig(dtype="float16"), "model.dtype = 'float16'"),
        (ModelConfig(hidden=[0]), "model.hidden"),
    ],
)
def test_bad_model_config_raises(cfg, fragment):
    with pytest.raises(ConfigError, match=fragment):
        build_model(cfg, 4, 3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_null_model_writes_a_zero_gradient_whatever_the_buffer_held(dtype):
    # learners hand it buffers from np.empty (or a shard's scratch): it must define every element
    m = build_model(ModelConfig(kind="null", size_mib=0.01, dtype=dtype), 5, 3)
    w = m.init_params(0)
    grad = np.full_like(w, np.nan)
    m.loss_grad(w, *toy(), grad)
    assert np.array_equal(grad, np.zeros_like(w))
