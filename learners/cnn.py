"""A small convolutional network over one flat parameter vector, for square grey-scale images.

    image [side x side] -> conv 3x3 (pad 1, c1 filters) -> ReLU -> max-pool 2x2 (stride 2)
                        -> conv 3x3 (pad 1, c2 filters) -> ReLU -> flatten -> dense -> softmax

The layout follows :mod:`learners.mlp`: every tensor is a reshaped view of the flat vector,
and gradients are written through the same views into a preallocated flat ``grad``. Flat order:

=====  ======================  =============================================================
W1     ``[9 * 1, c1]``         rows indexed by (dy, dx, in-channel), row-major
b1     ``[c1]``
W2     ``[9 * c1, c2]``        rows indexed by (dy, dx, in-channel), row-major
b2     ``[c2]``
W3     ``[p * p * c2, K]``     rows indexed by (y, x, channel) of the pooled grid, p = side // 2
b3     ``[K]``
=====  ======================  =============================================================

Activations are channels-last (``[N, H, W, C]``) so that a convolution is one im2col gather
(nine shifted slices of a zero-padded copy) followed by one matrix product: the work lands in
BLAS/cuBLAS, and the code uses only operations numpy and CuPy share (slicing, reshape,
transpose, matmul, argmax), so ``xp=cupy`` runs it on a GPU unchanged. An odd side is cropped
by the pooling (its last row and column do not reach the second convolution), as in PyTorch.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, NamedTuple

import numpy

from learners.contract import DTYPES, Model
from learners.losses import cross_entropy, evaluate_in_batches
from pserver.errors import ConfigError
from pserver.plan.config import ModelConfig

DEFAULT_CHANNELS = (32, 64)

# The nine (dy, dx) offsets of a 3x3 kernel into the zero-padded input, in W1/W2 row order.
_TAPS = tuple((dy, dx) for dy in range(3) for dx in range(3))


class _Cache(NamedTuple):
    """What the backward pass needs from the forward pass of one batch."""

    cols1: Any  # [N*s*s, 9]       im2col of the input
    a1: Any  # [N, s, s, c1]       first convolution after ReLU
    arg: Any  # [N, p, p, c1]      which of the four pooled pixels won (0..3, row-major)
    cols2: Any  # [N*p*p, 9*c1]    im2col of the pooled map
    a2: Any  # [N*p*p, c2]         second convolution after ReLU
    flat: Any  # [N, p*p*c2]       a2, one row per sample (the dense layer's input)


class CNN(Model):
    """conv-ReLU-maxpool-conv-ReLU-dense classifier for ``side x side`` single-channel inputs."""

    def __init__(
        self,
        side: int,
        n_classes: int,
        channels: tuple[int, int] | list[int] = DEFAULT_CHANNELS,
        dtype: str = "float32",
        xp: ModuleType = numpy,
    ):
        if side < 2:
            raise ValueError(f"the CNN pools 2x2, so it needs images of side >= 2, got {side}")
        c1, c2 = (int(c) for c in channels)
        self.side, self.pooled, self.n_classes = side, side // 2, n_classes
        self.channels = (c1, c2)
        self.dtype = numpy.dtype(dtype)
        self.xp = xp
        p2 = self.pooled * self.pooled
        self.shapes = [(9, c1), (c1,), (9 * c1, c2), (c2,), (p2 * c2, n_classes), (n_classes,)]
        self.layer_sizes = [math.prod(s) for s in self.shapes]
        self.offsets = [0]
        for n in self.layer_sizes:
            self.offsets.append(self.offsets[-1] + n)
        self.n_params = self.offsets[-1]

    def activation_bytes(self) -> int:
        """One sample's im2col matrices (and their gradients), feature maps and pooling
        indices, counted twice for the backward pass's temporaries."""
        s2, p2 = self.side * self.side, self.pooled * self.pooled
        c1, c2 = self.channels
        per_sample = s2 * (9 + 2 * c1 + 2) + p2 * (9 * c1 + 2 * c1 + 2 * c2 + 2)
        return 2 * per_sample * self.dtype.itemsize

    def views(self, v: Any) -> list[Any]:
        """``[W1, b1, W2, b2, W3, b3]``: shaped views of the flat vector ``v``."""
        if v.shape != (self.n_params,):
            raise ValueError(f"expected a flat vector of {self.n_params} values, got {v.shape}")
        bounds = zip(self.offsets[:-1], self.offsets[1:], strict=True)
        return [v[a:e].reshape(s) for (a, e), s in zip(bounds, self.shapes, strict=True)]

    def init_params(self, seed: int) -> numpy.ndarray:
        """He-normal convolutions (ReLU follows them), Glorot-uniform output layer, zero biases."""
        rng = numpy.random.default_rng(seed)
        w = numpy.zeros(self.n_params, dtype=self.dtype)
        W1, _, W2, _, W3, _ = self.views(w)
        for W in (W1, W2):
            W[...] = rng.normal(0.0, math.sqrt(2.0 / W.shape[0]), size=W.shape)
        limit = math.sqrt(6.0 / (W3.shape[0] + W3.shape[1]))
        W3[...] = rng.uniform(-limit, limit, size=W3.shape)
        return w

    def forward(self, params: list[Any], X: Any) -> tuple[Any, _Cache]:
        """Logits of the batch ``X [N, side*side]`` and the intermediates backward needs."""
        xp = self.xp
        W1, b1, W2, b2, W3, b3 = params
        n, s, p = X.shape[0], self.side, self.pooled
        if X.ndim != 2 or X.shape[1] != s * s:
            raise ValueError(f"expected inputs of shape [N, {s * s}], got {X.shape}")
        cols1 = im2col(xp, X.astype(self.dtype, copy=False).reshape(n, s, s, 1))
        a1 = _dense_relu(xp, cols1, W1, b1).reshape(n, s, s, -1)
        pooled, arg = max_pool(xp, a1)
        cols2 = im2col(xp, pooled)
        a2 = _dense_relu(xp, cols2, W2, b2)
        flat = a2.reshape(n, p * p * self.channels[1])
        logits = xp.matmul(flat, W3)
        logits += b3
        return logits, _Cache(cols1, a1, arg, cols2, a2, flat)

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        """Mean cross-entropy and error rate on the batch; write d(mean loss)/dw into ``grad``."""
        xp = self.xp
        params = self.views(w)
        gW1, gb1, gW2, gb2, gW3, gb3 = self.views(grad)
        logits, c = self.forward(params, X)
        loss, err, d = cross_entropy(xp, logits, y, want_grad=True)
        # dense layer
        xp.matmul(c.flat.T, d, out=gW3)
        xp.sum(d, axis=0, out=gb3)
        d = xp.matmul(d, params[4].T).reshape(c.a2.shape)
        # second convolution (ReLU, then the matmul of its im2col)
        d *= c.a2 > 0
        xp.matmul(c.cols2.T, d, out=gW2)
        xp.sum(d, axis=0, out=gb2)
        d = col2im(xp, xp.matmul(d, params[2].T), c.arg.shape)
        # pooling, then the first convolution (its input gradient is never needed)
        d = max_unpool(xp, d, c.arg, c.a1.shape)
        d *= c.a1 > 0
        d = d.reshape(c.cols1.shape[0], -1)
        xp.matmul(c.cols1.T, d, out=gW1)
        xp.sum(d, axis=0, out=gb1)
        return loss, err

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        """Mean loss and error rate over a whole set, computed ``batch`` samples at a time."""
        params = self.views(w)
        return evaluate_in_batches(self.xp, lambda Xb: self.forward(params, Xb)[0], X, y, batch)


def _dense_relu(xp: ModuleType, x: Any, W: Any, b: Any) -> Any:
    """``max(x @ W + b, 0)``, computed in the product's own (fresh) buffer."""
    z = xp.matmul(x, W)
    z += b
    xp.maximum(z, 0, out=z)
    return z


def im2col(xp: ModuleType, x: Any) -> Any:
    """``[N, H, W, C]`` -> ``[N*H*W, 9*C]``: each pixel's 3x3 neighbourhood (zero-padded), one row.

    Column ``k*C + c`` holds channel ``c`` at offset ``_TAPS[k]``, matching the rows of W1/W2.
    """
    n, h, w, c = x.shape
    padded = xp.zeros((n, h + 2, w + 2, c), dtype=x.dtype)
    padded[:, 1:-1, 1:-1, :] = x
    cols = xp.empty((n, h, w, 9, c), dtype=x.dtype)
    for k, (dy, dx) in enumerate(_TAPS):
        cols[:, :, :, k, :] = padded[:, dy : dy + h, dx : dx + w, :]
    return cols.reshape(n * h * w, 9 * c)


def col2im(xp: ModuleType, dcols: Any, shape: tuple[int, ...]) -> Any:
    """The adjoint of :func:`im2col`: sum each row's nine taps back onto ``[N, H, W, C]``."""
    n, h, w, c = shape
    dcols = dcols.reshape(n, h, w, 9, c)
    padded = xp.zeros((n, h + 2, w + 2, c), dtype=dcols.dtype)
    for k, (dy, dx) in enumerate(_TAPS):
        padded[:, dy : dy + h, dx : dx + w, :] += dcols[:, :, :, k, :]
    return padded[:, 1:-1, 1:-1, :]


def max_pool(xp: ModuleType, a: Any) -> tuple[Any, Any]:
    """2x2 max-pooling of ``[N, H, W, C]`` (stride 2, odd edges cropped) and the winners' index.

    The index (0..3 within each window, the first maximum on ties) makes the backward pass send
    the gradient to exactly one pixel, as the derivative of ``max`` does.
    """
    n, h, _, c = a.shape
    p = h // 2
    windows = a[:, : 2 * p, : 2 * p, :].reshape(n, p, 2, p, 2, c)
    windows = windows.transpose(0, 1, 3, 5, 2, 4).reshape(n, p, p, c, 4)
    return xp.max(windows, axis=-1), xp.argmax(windows, axis=-1)


def max_unpool(xp: ModuleType, d: Any, arg: Any, shape: tuple[int, ...]) -> Any:
    """The gradient of :func:`max_pool`: ``d [N, p, p, C]`` placed at the winners on ``shape``."""
    n, p, _, c = d.shape
    onehot = xp.arange(4) == arg[..., None]  # [N, p, p, C, 4]
    windows = (onehot * d[..., None]).reshape(n, p, p, c, 2, 2)
    full = windows.transpose(0, 1, 4, 2, 5, 3).reshape(n, 2 * p, 2 * p, c)
    if full.shape == tuple(shape):
        return full
    out = xp.zeros(shape, dtype=d.dtype)  # odd side: the cropped row and column get no gradient
    out[:, : 2 * p, : 2 * p, :] = full
    return out


def build_cnn(cfg: ModelConfig, n_features: int, n_classes: int, xp: ModuleType = numpy) -> CNN:
    """The CNN for ``n_features = side**2`` single-channel pixels and ``n_classes`` outputs.

    Reads ``cfg.channels`` (two filter counts, [conv1, conv2]) when the config has that key,
    else uses :data:`DEFAULT_CHANNELS`.
    """
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"model.dtype = {cfg.dtype!r}: expected one of {', '.join(DTYPES)}")
    if n_classes < 2:
        raise ConfigError(f"a model needs >= 2 classes, got {n_classes}")
    side = math.isqrt(max(n_features, 0))
    if side < 2 or side * side != n_features:
        raise ConfigError(
            f'model.kind = "cnn" needs square single-channel images (side x side pixels, '
            f"side >= 2), but the data has n_features = {n_features}; use model.kind = "
            f'"mlp" for non-image data'
        )
    channels = list(getattr(cfg, "channels", DEFAULT_CHANNELS))
    if len(channels) != 2 or any(not isinstance(c, int) or c <= 0 for c in channels):
        raise ConfigError(
            f"model.channels = {channels!r}: expected two positive filter counts, "
            "[conv1, conv2] (e.g. [32, 64])"
        )
    return CNN(side, n_classes, channels, cfg.dtype, xp)
