"""A PyTorch ``nn.Module`` as a :class:`~learners.contract.Model` (``model.kind = "torch"``).

The module's parameters are views into pserver's flat weight vector and their ``.grad`` views
into pserver's flat gradient vector, so a step copies nothing:

* ``w`` (numpy, or CuPy on a GPU) is wrapped by ``torch.from_numpy`` / ``torch.from_dlpack``
  (shared memory), cut into one view per parameter, and each ``param.data`` is pointed at its
  view. A learner installs a newly pulled model by swapping buffers
  (:mod:`pserver.roles.learner`), so ``w`` alternates between a few buffers: the views of the
  last :data:`CACHED` buffers are kept, keyed by address, and switching buffer re-points each
  parameter (``param.data = view``, about a microsecond each), not a copy of the model.
* ``grad`` is zeroed and its views set as ``param.grad``; autograd then accumulates into an
  existing ``.grad`` in place (``AccumulateGrad`` adds into a defined gradient when no graph of
  the gradient is built), so the backward pass writes d(loss)/dw straight into pserver's buffer.

The flat order is ``module.parameters()`` (one layer size per tensor, for ``blocks.split =
"layer"``). Buffers (BatchNorm running statistics) are not parameters: each rank keeps its own.

Weights start as the factory's module built after ``torch.manual_seed(run.seed)``, so a plain
PyTorch loop that seeds the same way starts from the same model (``tests/test_torch_model.py``
checks λ = 1 against one). Inputs arrive as ``[N, F]`` rows (reshape inside the module) cast to
``model.dtype``; labels as int64 class indices.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy

from learners.contract import Model
from learners.loader import call_factory, load_factory, why
from pserver.errors import ConfigError

CACHED = 4  # weight (and gradient) buffers whose views are kept: a learner cycles 2-3
PROBE_ROWS = 2  # rows of the start-up forward pass that checks the output against the labels


def import_torch(spec: str) -> ModuleType:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            f'model.kind = "torch" (model.module = {spec!r}) needs PyTorch: '
            "pip install -e .[torch]"
        ) from None
    return torch


class TorchModel(Model):
    """An ``nn.Module`` (and its loss) computing on pserver's flat buffers."""

    def __init__(
        self,
        spec: str,
        n_features: int,
        n_classes: int,
        dtype: str = "float32",
        xp: ModuleType = numpy,
    ):
        torch = self.torch = import_torch(spec)
        self.spec, self.n_features, self.n_classes = spec, n_features, n_classes
        self.dtype, self.xp = numpy.dtype(dtype), xp
        self.tdtype = {"float32": torch.float32, "float64": torch.float64}[self.dtype.name]
        self.device = self.choose_device(xp)
        self.factory = load_factory(spec)
        self.module, self.loss_fn = self.build()
        self.params = list(self.module.parameters())
        if not self.params:
            raise ConfigError(
                f"model.module = {spec!r}: the module has no parameters, so there is nothing to "
                "train (its layers must be attributes of the module, e.g. self.fc = nn.Linear())"
            )
        self.shapes = [tuple(p.shape) for p in self.params]
        self.layer_sizes = [math.prod(s) for s in self.shapes]
        self.n_params = sum(self.layer_sizes)
        self.offsets = numpy.concatenate([[0], numpy.cumsum(self.layer_sizes)]).tolist()
        # address of a flat buffer -> (the buffer as one tensor, its per-parameter views)
        self._data: OrderedDict[tuple[int, int], tuple[Any, list[Any]]] = OrderedDict()
        self._grad: OrderedDict[tuple[int, int], tuple[Any, list[Any]]] = OrderedDict()
        self._bound_data: tuple[int, int] | None = None
        self._bound_grad: tuple[int, int] | None = None
        self.probe()

    # -- building --------------------------------------------------------------------------------

    def choose_device(self, xp: ModuleType) -> Any:
        torch = self.torch
        if xp.__name__ == "numpy":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ConfigError(
                f'model.kind = "torch" on run.device = "gpu" needs a PyTorch built with CUDA; '
                f"this one ({torch.__version__}) sees no CUDA device: set run.device = \"cpu\""
            )
        return torch.device("cuda", xp.cuda.Device().id)  # the device the backend chose

    def build(self) -> tuple[Any, Callable[[Any, Any], Any]]:
        """The factory's module (cast to model.dtype, on our device) and its loss."""
        torch = self.torch
        made = call_factory(self.factory, self.spec, n_features=self.n_features,
                            n_classes=self.n_classes)
        loss_fn = torch.nn.functional.cross_entropy
        if isinstance(made, tuple) and len(made) == 2 and callable(made[1]):
            made, loss_fn = made  # the factory said otherwise: (module, loss(output, y))
        if not isinstance(made, torch.nn.Module):
            raise ConfigError(
                f"model.module = {self.spec!r}: returned {type(made).__name__}, expected a "
                "torch.nn.Module (or a (module, loss_function) pair)"
            )
        return made.to(device=self.device, dtype=self.tdtype), loss_fn

    def probe(self) -> None:
        """One forward pass and loss on ``PROBE_ROWS`` zero rows: the output must be
        ``[N, C]`` scores with C >= the data's classes, the loss a finite-typed scalar."""
        torch = self.torch
        X = torch.zeros(PROBE_ROWS, self.n_features, dtype=self.tdtype, device=self.device)
        y = torch.zeros(PROBE_ROWS, dtype=torch.int64, device=self.device)
        where = f"model.module = {self.spec!r}"
        self.module.eval()  # no BatchNorm statistics touched by the probe
        try:
            with torch.no_grad():
                out = self.module(X)
        except Exception as e:  # noqa: BLE001 - the user's code
            raise ConfigError(
                f"{where}: the forward pass of a [{PROBE_ROWS}, {self.n_features}] batch failed "
                f"(inputs arrive as rows of {self.n_features} features; reshape inside the "
                f"module): {why(e)}"
            ) from None
        if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != PROBE_ROWS:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ConfigError(
                f"{where}: the output of a [{PROBE_ROWS}, {self.n_features}] batch is {got}, "
                f"expected [{PROBE_ROWS}, {self.n_classes}] class scores"
            )
        if out.shape[1] < self.n_classes:
            raise ConfigError(
                f"{where}: the module outputs {out.shape[1]} scores per sample but the labels "
                f"have {self.n_classes} classes (0..{self.n_classes - 1}): give it "
                f"{self.n_classes} outputs"
            )
        try:
            with torch.no_grad():
                loss = self.loss_fn(out, y)
        except Exception as e:  # noqa: BLE001 - the user's code
            raise ConfigError(f"{where}: its loss on the output failed: {why(e)}") from None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ConfigError(f"{where}: its loss must return one number (a scalar tensor)")
        self._training: bool | None = None

    # -- the flat buffers ------------------------------------------------------------------------

    def as_tensor(self, a: Any) -> Any:
        """``a`` (numpy or CuPy) as a torch tensor on the same memory."""
        if isinstance(a, numpy.ndarray):
            return self.torch.from_numpy(a)
        return self.torch.from_dlpack(a)

    @staticmethod
    def address(a: Any) -> tuple[int, int]:
        if isinstance(a, numpy.ndarray):
            return a.__array_interface__["data"][0], a.size
        return a.data.ptr, a.size

    def views(
        self, cache: OrderedDict[tuple[int, int], tuple[Any, list[Any]]], a: Any
    ) -> tuple[Any, list[Any]]:
        """The flat vector ``a`` as a tensor and one shaped view of it per parameter (cached by
        address: a cached view keeps its buffer alive, so its address cannot be reused)."""
        key = self.address(a)
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        if a.shape != (self.n_params,) or a.dtype != self.dtype:
            raise ValueError(f"expected a flat {self.dtype} vector of {self.n_params}, got "
                             f"{a.dtype} {a.shape}")
        flat = self.as_tensor(a)
        out = flat, [flat[s:e].view(shape) for s, e, shape in
                     zip(self.offsets[:-1], self.offsets[1:], self.shapes, strict=True)]
        cache[key] = out
        if len(cache) > CACHED:
            cache.popitem(last=False)
        return out

    def bind(self, w: Any, grad: Any | None = None) -> Any:
        """Point every parameter at its slice of ``w`` (and its ``.grad`` at ``grad``); returns
        ``grad`` as one tensor (None without ``grad``)."""
        key = self.address(w)
        if key != self._bound_data:
            for p, v in zip(self.params, self.views(self._data, w)[1], strict=True):
                p.data = v
            self._bound_data = key
        if grad is None:
            return None
        flat, views = self.views(self._grad, grad)
        key = self.address(grad)
        if key != self._bound_grad:
            for p, v in zip(self.params, views, strict=True):
                p.grad = v
            self._bound_grad = key
        return flat

    def mode(self, training: bool) -> None:
        if self._training is not training:
            self.module.train(training)
            self._training = training

    def inputs(self, X: Any, y: Any) -> tuple[Any, Any]:
        Xt = self.as_tensor(X)
        if Xt.dtype != self.tdtype:
            Xt = Xt.to(self.tdtype)
        return Xt, self.as_tensor(y)

    # -- the contract ----------------------------------------------------------------------------

    def init_params(self, seed: int) -> numpy.ndarray:
        """The factory's module built after ``torch.manual_seed(seed)``, flattened (host)."""
        torch = self.torch
        with torch.random.fork_rng(devices=[]):  # the caller's RNG state is left as it was
            torch.manual_seed(seed)
            fresh, _ = self.build()
        w = numpy.empty(self.n_params, self.dtype)
        with torch.no_grad():
            for p, v in zip(fresh.parameters(), self.views(OrderedDict(), w)[1], strict=True):
                v.copy_(p.detach().to("cpu"))
        return w

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        """Loss and error rate of the batch; d(loss)/dw lands in ``grad`` through the
        parameters' ``.grad`` views (zeroed first: autograd adds into them)."""
        torch = self.torch
        flat_grad = self.bind(w, grad)
        self.mode(True)
        flat_grad.zero_()  # through torch: on its stream, before the backward pass
        Xt, yt = self.inputs(X, y)
        with torch.enable_grad():
            out = self.module(Xt)
            loss = self.loss_fn(out, yt)
            loss.backward()
        with torch.no_grad():
            err = (out.argmax(dim=1) != yt).double().mean()
        return float(loss.detach()), float(err)

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        """Mean loss and error rate over a whole set, ``batch`` samples at a time."""
        torch = self.torch
        n = X.shape[0]
        if n == 0:
            raise ValueError("cannot evaluate on an empty set")
        self.bind(w)
        self.mode(False)
        total_loss = total_err = 0.0
        with torch.no_grad():
            for a in range(0, n, batch):
                Xt, yt = self.inputs(X[a : a + batch], y[a : a + batch])
                out = self.module(Xt)
                m = Xt.shape[0]
                total_loss += float(self.loss_fn(out, yt)) * m
                total_err += float((out.argmax(dim=1) != yt).double().sum())
        return total_loss / n, total_err / n
