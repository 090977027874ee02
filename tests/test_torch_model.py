"""The PyTorch adapter (learners/torch_model.py) in one process: shared memory, gradients in
place, buffer swaps, λ = 1 against a plain PyTorch loop, bad modules refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpirun import ROOT

from learners.data import BatchSampler, load_dataset
from learners.factory import build_model
from learners.serial import serial_steps, train_serial
from pserver.errors import ConfigError
from pserver.plan.config import load_config

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # as a rank does (run.blas_threads): the machine runs other tests too

CNN = str(ROOT / "examples" / "torch_cnn.py")


def model(spec: str = f"{CNN}:build", dtype: str = "float32", n_features: int = 64):
    cfg = load_config(None, ["model.kind=torch", f"model.module={spec}", f"model.dtype={dtype}"])
    return build_model(cfg.model, n_features, 10)


def batch(n: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def reference_grad(m, w, X, y):
    """d(loss)/dw by autograd on a separate copy of the module, flattened."""
    ref = m.factory(n_features=64, n_classes=10).to(m.tdtype)
    with torch.no_grad():
        for p, v in zip(ref.parameters(), m.views({}, w.copy())[1], strict=True):
            p.copy_(v)
    loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(X).to(m.tdtype)),
                                             torch.from_numpy(y))
    loss.backward()
    return np.concatenate([p.grad.numpy().ravel() for p in ref.parameters()]), float(loss.detach())


def test_parameters_are_views_of_the_flat_weight_buffer():
    m = model()
    w, g = m.init_params(0), np.empty(m.n_params, np.float32)
    X, y = batch()
    m.loss_grad(w, X, y, g)
    base, end = w.ctypes.data, w.ctypes.data + w.nbytes
    for p in m.params:
        assert base <= p.data_ptr() < end  # shared memory, not a copy
    w[:] = 0.0  # writing the buffer is writing the module
    assert all(float(p.detach().abs().sum()) == 0.0 for p in m.params)
    assert m.layer_sizes == [p.numel() for p in m.params]
    assert sum(m.layer_sizes) == m.n_params == w.size


def test_gradients_land_in_the_gradient_buffer_and_are_not_accumulated():
    m = model(dtype="float64")
    w, g = m.init_params(3), np.full(m.n_params, np.nan)
    X, y = batch()
    loss, err = m.loss_grad(w, X, y, g)
    for p in m.params:
        assert g.ctypes.data <= p.grad.data_ptr() < g.ctypes.data + g.nbytes
    want, want_loss = reference_grad(m, w, X, y)
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-14)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    assert 0.0 <= err <= 1.0
    m.loss_grad(w, X, y, g)  # a second step: the gradient, not twice the gradient
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-14)


def test_swapped_buffers_compute_on_the_buffer_given():
    m = model(dtype="float64")
    w1, w2 = m.init_params(0), m.init_params(1)
    g1, g2 = np.empty_like(w1), np.empty_like(w1)
    X, y = batch()
    for _ in range(3):  # alternating, as a learner installing pulled models does
        m.loss_grad(w1, X, y, g1)
        m.loss_grad(w2, X, y, g2)
        np.testing.assert_allclose(g1, reference_grad(m, w1, X, y)[0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(g2, reference_grad(m, w2, X, y)[0], rtol=1e-12, atol=1e-14)
    assert not np.allclose(g1, g2)


def test_init_params_is_the_factorys_module_after_manual_seed_and_leaves_the_rng_alone():
    m = model()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    w = m.init_params(7)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(7)
    ref = m.factory(n_features=64, n_classes=10)
    np.testing.assert_array_equal(
        w, np.concatenate([p.detach().numpy().ravel() for p in ref.parameters()])
    )
    assert not np.array_equal(w, m.init_params(8))


def test_evaluate_matches_the_batch_loss():
    m = model(dtype="float64")
    w = m.init_params(0)
    X, y = batch(50)
    loss, err = m.evaluate(w, X, y, batch=7)
    want_loss, _ = reference_grad(m, w, X, y)[1], None
    assert loss == pytest.approx(want_loss, rel=1e-10)
    assert 0.0 <= err <= 1.0


def plain_torch_loop(cfg, dataset, factory):
    """What a PyTorch user writes: the same seed, minibatches and SGD, no pserver."""
    torch.manual_seed(cfg.run.seed)
    net = factory(n_features=dataset.n_features, n_classes=dataset.n_classes)
    net = net.to({"float32": torch.float32, "float64": torch.float64}[cfg.model.dtype])
    opt = torch.optim.SGD(net.parameters(), lr=cfg.optim.lr)
    sampler = BatchSampler(len(dataset.y_train), cfg.data.batch_size, cfg.run.seed)
    X, y = torch.from_numpy(dataset.X_train), torch.from_numpy(dataset.y_train)
    for _ in range(serial_steps(cfg, len(dataset.y_train))):
        idx = torch.from_numpy(sampler.next())
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(X[idx].to(opt.param_groups[0]["params"][0]
                                                               .dtype)), y[idx])
        loss.backward()
        opt.step()
    return np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])


def plain_sgd_config(dtype: str, *extra: str):
    return load_config(ROOT / "examples" / "torch_cnn.toml", [
        "protocol.name=hardsync", "optim.rule=sgd", "optim.lr=0.05", "optim.weight_decay=0",
        "run.epochs=1", f"model.dtype={dtype}", *extra,
    ])


@pytest.mark.parametrize(
    "factory, dtype, tol", [("build_mlp", "float64", 1e-9), ("build", "float32", 2e-4)]
)
def test_serial_sgd_through_the_adapter_equals_a_plain_torch_loop(factory, dtype, tol):
    cfg = plain_sgd_config(dtype, f"model.module={CNN}:{factory}")
    ds = load_dataset(cfg.data, cfg.run.seed)
    m = build_model(cfg.model, ds.n_features, ds.n_classes)
    w = train_serial(cfg, ds)
    want = plain_torch_loop(cfg, ds, m.factory)
    assert not np.allclose(want, m.init_params(cfg.run.seed), atol=1e-3)  # it trained
    np.testing.assert_allclose(w, want, rtol=tol, atol=tol)


def test_a_factory_may_name_its_loss(tmp_path):
    path = tmp_path / "nll.py"
    path.write_text(
        "import torch\n"
        "def build(n_features, n_classes):\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(n_features, n_classes),\n"
        "                              torch.nn.LogSoftmax(dim=1))\n"
        "    return net, torch.nn.functional.nll_loss\n"
    )
    m = model(f"{path}:build", dtype="float64")
    w, g = m.init_params(0), np.empty(m.n_params)
    X, y = batch()
    loss, _ = m.loss_grad(w, X, y, g)
    W = w[: 64 * 10].reshape(10, 64)
    z = X.astype(np.float64) @ W.T + w[640:]
    z -= z.max(axis=1, keepdims=True)
    want = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(16), y]))
    assert loss == pytest.approx(want, rel=1e-10)


BAD = {
    "missing file": ("missing.py:build", None, "does not exist"),
    "no factory": ("m.py:nope", "import torch\ndef build(): pass\n", "has no 'nope'"),
    "no name": ("m.py", "", 'e.g. "'),
    "import fails": ("m.py:build", "import torch\nimport no_such_module_x\n",
                     "ModuleNotFoundError"),
    "syntax error": ("m.py:build", "def build(:\n", "SyntaxError"),
    "factory raises": ("m.py:build", "def build():\n    raise ValueError('nope, 7 layers')\n",
                       "ValueError: nope, 7 layers"),
    "not a module": ("m.py:build", "def build():\n    return 3\n", "expected a torch.nn.Module"),
    "no parameters": ("m.py:build", "import torch\ndef build():\n    return torch.nn.ReLU()\n",
                      "no parameters"),
    "wrong input width": ("m.py:build",
                          "import torch\ndef build():\n    return torch.nn.Linear(10, 10)\n",
                          "forward pass"),
    "too few outputs": ("m.py:build",
                        "import torch\ndef build(n_features):\n"
                        "    return torch.nn.Linear(n_features, 3)\n",
                        "outputs 3 scores per sample but the labels have 10 classes"),
    "not scores": ("m.py:build",
                   "import torch\ndef build(n_features):\n"
                   "    return torch.nn.Sequential(torch.nn.Linear(n_features, 10),"
                   " torch.nn.Flatten(0))\n",
                   "expected [2, 10] class scores"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_modules_are_one_config_error(tmp_path, case):
    spec, source, message = BAD[case]
    if source is not None:
        (tmp_path / "m.py").write_text(source)
    with pytest.raises(ConfigError, match="model.module") as e:
        model(str(tmp_path / spec))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_dotted_module_path_loads_too(monkeypatch, tmp_path):
    (tmp_path / "my_nets.py").write_text(
        "import torch\ndef tiny(n_features, n_classes):\n"
        "    return torch.nn.Linear(n_features, n_classes)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("my_nets:tiny", "my_nets.tiny"):
        assert model(spec).n_params == 64 * 10 + 10


def test_the_blas_thread_limit_reaches_torch(monkeypatch):
    import pserver.optim.blas as blas

    before = torch.get_num_threads()
    monkeypatch.setattr(blas, "_chosen", 1)
    try:
        blas.limit_late_blas()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_layer_blocks_follow_the_parameters():
    from pserver.plan.topology import split_blocks

    m = model()
    blocks = split_blocks(m.n_params, m.layer_sizes, "layer", 1, 2)
    assert [b.stop - b.start for b in blocks] == m.layer_sizes
    assert math.prod(m.shapes[0]) == m.layer_sizes[0]
