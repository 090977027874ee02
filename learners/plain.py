"""Any model written as a plain class (``model.kind = "python"``; the interface in docs/models.md).

The class (or a function returning an instance) named by ``model.module`` is called with
``n_features`` and ``n_classes`` where it declares them, and must have

* ``init_params(seed) -> flat array`` of float values (cast to ``model.dtype``),
* ``loss_grad(w, X, y, grad_out) -> loss`` (or ``(loss, error)``), writing d(mean loss)/dw into
  ``grad_out`` in place,
* ``predict(w, X) -> [N, C] class scores`` (or ``[N]`` labels),

optionally ``layer_sizes`` (parameters per tensor, in flat order, for ``blocks.split =
"layer"``) and ``evaluate(w, X, y) -> (loss, error)`` (else test loss and error come from
``loss_grad`` and ``predict``, batch by batch). ``w``, ``X``, ``y``, ``grad_out`` are arrays of
the run's array module (numpy; CuPy with ``run.device = "gpu"``), so JAX or hand-written numpy
models plug in. Checked at start-up on every rank with a two-row batch of zeros.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy

from learners.contract import Model
from learners.loader import call_factory, load_factory, why
from pserver.errors import ConfigError

METHODS = ("init_params", "loss_grad", "predict")
PROBE_ROWS = 2


class PlainModel(Model):
    """Adapter from the plain interface (module docstring) to :class:`~learners.contract.Model`."""

    def __init__(
        self,
        spec: str,
        n_features: int,
        n_classes: int,
        dtype: str = "float32",
        xp: ModuleType = numpy,
    ):
        self.spec, self.n_classes = spec, n_classes
        self.dtype, self.xp = numpy.dtype(dtype), xp
        self.impl = call_factory(load_factory(spec), spec, n_features=n_features,
                                 n_classes=n_classes)
        where = f"model.module = {spec!r}"
        missing = [m for m in METHODS if not callable(getattr(self.impl, m, None))]
        if missing:
            raise ConfigError(
                f"{where}: {type(self.impl).__name__} lacks {', '.join(missing)}; a plain model "
                "has init_params(seed), loss_grad(w, X, y, grad_out) and predict(w, X) "
                "(docs/models.md)"
            )
        w0 = self.init_params(0)
        self.n_params = int(w0.size)
        sizes = getattr(self.impl, "layer_sizes", None)
        self.layer_sizes = [self.n_params] if sizes is None else [int(s) for s in sizes]
        if sum(self.layer_sizes) != self.n_params or min(self.layer_sizes) < 1:
            raise ConfigError(
                f"{where}: layer_sizes {self.layer_sizes} must be positive and add up to the "
                f"{self.n_params} parameters init_params returns"
            )
        self.probe(w0, n_features)

    def probe(self, w0: numpy.ndarray, n_features: int) -> None:
        """``loss_grad`` and ``predict`` on two zero rows: a finite loss, scores that fit the
        labels."""
        xp, where = self.xp, f"model.module = {self.spec!r}"
        w = xp.asarray(w0)
        X = xp.zeros((PROBE_ROWS, n_features), dtype=numpy.float32)
        y = xp.zeros(PROBE_ROWS, dtype=numpy.int64)
        grad = xp.zeros_like(w)
        try:
            loss, _ = self.loss_grad(w, X, y, grad)
        except Exception as e:  # noqa: BLE001 - the user's code
            raise ConfigError(f"{where}: loss_grad on a [{PROBE_ROWS}, {n_features}] batch "
                              f"failed: {why(e)}") from None
        if not math.isfinite(loss):
            raise ConfigError(f"{where}: loss_grad returned a loss of {loss} at init_params(0)")
        try:
            out = self.impl.predict(w, X)
        except Exception as e:  # noqa: BLE001 - the user's code
            raise ConfigError(f"{where}: predict on a [{PROBE_ROWS}, {n_features}] batch "
                              f"failed: {why(e)}") from None
        shape = tuple(getattr(out, "shape", ()))
        ok = shape == (PROBE_ROWS,) or (
            len(shape) == 2 and shape[0] == PROBE_ROWS and shape[1] >= self.n_classes
        )
        if not ok:
            raise ConfigError(
                f"{where}: predict of a [{PROBE_ROWS}, {n_features}] batch returned shape "
                f"{shape}, expected [{PROBE_ROWS}, {self.n_classes}] class scores or "
                f"[{PROBE_ROWS}] labels"
            )

    def init_params(self, seed: int) -> numpy.ndarray:
        w = self.impl.init_params(seed)
        w = numpy.array(w.get() if hasattr(w, "get") else w, dtype=self.dtype).reshape(-1)
        if w.size == 0:
            raise ConfigError(f"model.module = {self.spec!r}: init_params returned no parameters")
        return w

    def labels(self, w: Any, X: Any) -> Any:
        out = self.impl.predict(w, X)
        return out if out.ndim == 1 else self.xp.argmax(out, axis=1)

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        result = self.impl.loss_grad(w, X, y, grad)
        if isinstance(result, tuple):
            loss, err = result
            return float(loss), float(err)
        return float(result), float(self.xp.mean(self.labels(w, X) != y))

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        own = getattr(self.impl, "evaluate", None)
        if callable(own):
            loss, err = own(w, X, y)
            return float(loss), float(err)
        n = X.shape[0]
        if n == 0:
            raise ValueError("cannot evaluate on an empty set")
        scratch = self.xp.empty_like(w)  # loss_grad's gradient, discarded
        total_loss = total_err = 0.0
        for a in range(0, n, batch):
            Xb, yb = X[a : a + batch], y[a : a + batch]
            loss = self.impl.loss_grad(w, Xb, yb, scratch)
            loss = loss[0] if isinstance(loss, tuple) else loss
            total_loss += float(loss) * Xb.shape[0]
            total_err += float(self.xp.sum(self.labels(w, Xb) != yb))
        return total_loss / n, total_err / n
