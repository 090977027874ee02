"""The plain model interface (learners/plain.py) with a hand-written numpy model, in one
process: it computes what the built-in softmax computes, and bad classes are refused."""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import ROOT

from learners.factory import build_model
from learners.mlp import Softmax
from pserver.errors import ConfigError
from pserver.plan.config import load_config

SOFTMAX = f"{ROOT / 'examples' / 'numpy_softmax.py'}:NumpySoftmax"


def plain(spec: str = SOFTMAX, n_features: int = 64, dtype: str = "float64"):
    cfg = load_config(None, ["model.kind=python", f"model.module={spec}", f"model.dtype={dtype}"])
    return build_model(cfg.model, n_features, 10)


def test_the_numpy_softmax_computes_what_the_built_in_softmax_computes():
    m, ref = plain(), Softmax(64, 10, "float64")
    assert (m.n_params, m.layer_sizes) == (ref.n_params, ref.layer_sizes)  # same flat layout
    w = m.init_params(3)
    assert w.dtype == np.float64 and np.array_equal(w, m.init_params(3))
    rng = np.random.default_rng(0)
    X, y = rng.random((40, 64), dtype=np.float32), rng.integers(0, 10, 40)
    g, g_ref = np.empty_like(w), np.empty_like(w)
    loss, err = m.loss_grad(w, X, y, g)
    loss_ref, err_ref = ref.loss_grad(w, X, y, g_ref)
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-14)
    assert loss == pytest.approx(loss_ref, rel=1e-12) and err == err_ref  # err from predict
    np.testing.assert_allclose(m.evaluate(w, X, y, batch=7), ref.evaluate(w, X, y, batch=7),
                               rtol=1e-12)


def test_the_module_key_is_required_with_user_kinds_and_refused_with_the_others():
    for kind in ("torch", "python"):
        with pytest.raises(ConfigError, match="needs model.module"):
            load_config(None, [f"model.kind={kind}"])
    with pytest.raises(ConfigError, match="belongs to"):
        load_config(None, ["model.kind=mlp", f"model.module={SOFTMAX}"])


GOOD = '''
import numpy as np
class M:
    def __init__(self, n_features, n_classes):
        self.f, self.c = n_features, n_classes
    def init_params(self, seed):
        return np.zeros(self.f * self.c)
    def loss_grad(self, w, X, y, grad_out):
        grad_out[:] = 0
        return 1.0
    def predict(self, w, X):
        return np.zeros((len(X), self.c))
'''
BAD = {
    "missing method": ("del M.predict\n", "lacks predict"),
    "no parameters": ("M.init_params = lambda self, seed: np.zeros(0)\n", "no parameters"),
    "layer sizes": ("M.layer_sizes = [3, 4]\n", "layer_sizes"),
    "loss raises": ("def lg(self, w, X, y, g): raise KeyError('w1')\nM.loss_grad = lg\n",
                    "KeyError"),
    "loss nan": ("M.loss_grad = lambda self, w, X, y, g: float('nan')\n", "a loss of nan"),
    "predict shape": ("M.predict = lambda self, w, X: np.zeros((len(X), 3))\n",
                      "expected [2, 10] class scores or [2] labels"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_plain_models_are_one_config_error(tmp_path, case):
    patch, message = BAD[case]
    (tmp_path / "m.py").write_text(GOOD + patch)
    with pytest.raises(ConfigError, match="model.module") as e:
        plain(f"{tmp_path / 'm.py'}:M")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_good_one_loads_and_takes_only_the_arguments_it_declares(tmp_path):
    (tmp_path / "m.py").write_text(GOOD + "def make():\n    return M(64, 10)\n")
    assert plain(f"{tmp_path / 'm.py'}:M").n_params == 640
    assert plain(f"{tmp_path / 'm.py'}:make").layer_sizes == [640]
