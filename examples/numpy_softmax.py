"""A hand-written numpy softmax regression through pserver's plain model interface.

    mpiexec -n 5 pserver-run examples/quickstart.toml model.kind=python \\
        model.module=examples/numpy_softmax.py:NumpySoftmax

pserver calls ``NumpySoftmax(n_features, n_classes)`` and then only the three methods below
(docs/models.md, "The plain interface"). The flat vector is ``W [F x C]`` row-major, then ``b``.
"""

import numpy as np


class NumpySoftmax:
    def __init__(self, n_features: int, n_classes: int):
        self.f, self.c = n_features, n_classes
        self.layer_sizes = [n_features * n_classes, n_classes]  # optional: W, then b

    def split(self, v):
        return v[: self.f * self.c].reshape(self.f, self.c), v[self.f * self.c :]

    def init_params(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        w = np.zeros(self.f * self.c + self.c, dtype=np.float32)
        w[: self.f * self.c] = rng.normal(0.0, 0.01, self.f * self.c)
        return w

    def predict(self, w, X):
        W, b = self.split(w)
        return X.astype(w.dtype, copy=False) @ W + b  # [N, C] scores

    def loss_grad(self, w, X, y, grad_out) -> float:
        """Mean cross-entropy of the batch; its gradient is written into ``grad_out``."""
        X = X.astype(w.dtype, copy=False)
        z = self.predict(w, X)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(-np.log(p[rows, y]).mean())
        p[rows, y] -= 1.0
        p /= len(y)
        gW, gb = self.split(grad_out)
        np.matmul(X.T, p, out=gW)
        p.sum(axis=0, out=gb)
        return loss
