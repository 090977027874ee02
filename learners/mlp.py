"""Models over one flat parameter vector, written once against an array module ``xp``.

Every parameter tensor is a reshaped slice (a view) of the flat vector ``w``; gradients are
written through the same views into a preallocated flat ``grad``. Only functions that exist in
both numpy and CuPy are used, so ``xp=cupy`` runs the same code on a GPU.

Flat layout, layer by layer: ``W0 [in x out]`` (row-major), ``b0 [out]``, ``W1``, ``b1``, ...
A softmax regression is the special case with no hidden layer. ``w``, ``grad``, ``X`` and ``y``
must all live where ``xp`` computes (host arrays for numpy, device arrays for CuPy).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy

from learners.contract import Model
from learners.losses import cross_entropy, evaluate_in_batches


class MLP(Model):
    """Fully connected ReLU network with a softmax output and cross-entropy loss."""

    def __init__(self, widths: list[int], dtype: str = "float32", xp: ModuleType = numpy):
        self.widths = list(widths)  # [n_features, hidden..., n_classes]
        self.dtype = numpy.dtype(dtype)
        self.xp = xp
        self.shapes = list(zip(self.widths[:-1], self.widths[1:], strict=True))
        self.layer_sizes = [n for i, o in self.shapes for n in (i * o, o)]
        self.offsets = [0]
        for n in self.layer_sizes:
            self.offsets.append(self.offsets[-1] + n)
        self.n_params = self.offsets[-1]

    def activation_bytes(self) -> int:
        """Every layer's input kept for the backward pass, its delta and one temporary."""
        return 3 * sum(self.widths) * self.dtype.itemsize

    def views(self, v: Any) -> list[tuple[Any, Any]]:
        """``[(W, b), ...]``: views of the flat vector ``v``, one pair per layer."""
        if v.shape != (self.n_params,):
            raise ValueError(f"expected a flat vector of {self.n_params} values, got {v.shape}")
        out = []
        for k, (i, o) in enumerate(self.shapes):
            a, m, e = self.offsets[2 * k : 2 * k + 3]
            out.append((v[a:m].reshape(i, o), v[m:e]))
        return out

    def init_params(self, seed: int) -> numpy.ndarray:
        """He-normal weights for ReLU layers, Glorot-uniform for the output layer, zero biases."""
        rng = numpy.random.default_rng(seed)
        w = numpy.zeros(self.n_params, dtype=self.dtype)
        last = len(self.shapes) - 1
        for k, (W, _) in enumerate(self.views(w)):
            fan_in, fan_out = W.shape
            if k < last:
                W[...] = rng.normal(0.0, math.sqrt(2.0 / fan_in), size=W.shape)
            else:
                limit = math.sqrt(6.0 / (fan_in + fan_out))
                W[...] = rng.uniform(-limit, limit, size=W.shape)
        return w

    def forward(self, params: list[tuple[Any, Any]], X: Any) -> list[Any]:
        """Inputs of every layer followed by the output logits."""
        xp = self.xp
        acts = [X.astype(self.dtype, copy=False)]
        for k, (W, b) in enumerate(params):
            z = xp.matmul(acts[-1], W)
            z += b
            if k < len(params) - 1:
                xp.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        """Mean cross-entropy and error rate on the batch; write d(mean loss)/dw into ``grad``."""
        xp = self.xp
        params, grads = self.views(w), self.views(grad)
        acts = self.forward(params, X)
        loss, err, d = cross_entropy(xp, acts[-1], y, want_grad=True)
        for k in range(len(params) - 1, -1, -1):
            gW, gb = grads[k]
            xp.matmul(acts[k].T, d, out=gW)
            xp.sum(d, axis=0, out=gb)
            if k:
                d = xp.matmul(d, params[k][0].T)
                d *= acts[k] > 0
        return loss, err

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        """Mean loss and error rate over a whole set, computed ``batch`` samples at a time."""
        params = self.views(w)
        return evaluate_in_batches(self.xp, lambda Xb: self.forward(params, Xb)[-1], X, y, batch)


class Softmax(MLP):
    """Multinomial logistic regression: ``W [F x C]``, ``b [C]``."""

    def __init__(
        self, n_features: int, n_classes: int, dtype: str = "float32", xp: ModuleType = numpy
    ):
        super().__init__([n_features, n_classes], dtype, xp)
