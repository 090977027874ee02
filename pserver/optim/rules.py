"""Server-side update rules, applied in place to one parameter block.

One :class:`Updater` per parameter block owns that block's optimizer state (velocity, sum of
squared gradients) and a scratch buffer, all allocated once in ``__init__``. A step then touches
only preallocated memory: on numpy every operation writes through ``out=`` or an in-place
operator; on CuPy each rule is one fused element-wise kernel, so the update is a single pass over
memory instead of one pass per operator.

The formulas, with ``d`` the gradient after L2 weight decay (``d = g + wd * w``):

========  ==================================================================
sgd       ``w -= lr * d``
momentum  ``v = m * v + d;  w -= lr * v``
nesterov  ``v = m * v + d;  w -= lr * (d + m * v)``   (PyTorch's form)
adagrad   ``h += d * d;     w -= (lr * d) / (sqrt(h) + eps)``
========  ==================================================================

The numpy path evaluates exactly these expressions in the same order, rounding each operation to
the block's dtype (scalars are cast to that dtype, as NumPy does with Python floats), except
plain SGD on float32/float64: there ``w -= lr * d`` (and ``d = g + wd * w``) is BLAS ``axpy``,
one pass over memory instead of two. A server's update is memory bound, so it takes about half
the time (docs/performance.md), and it sits between a learner's push and its pull. ``axpy`` may
round ``w - lr * d`` once (a fused multiply-add) where NumPy rounds twice: the results agree to
float tolerance, and a run is still bit-for-bit the serial reference, which uses this same
updater. The CUDA kernels are compiled with ``--fmad=false`` so that ``a * b + c`` is not
contracted into a fused multiply-add: the GPU then rounds the same operations the same way, and
a run on a GPU can be checked against a numpy reference run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pserver.errors import ConfigError
from pserver.optim.blas import limit_late_blas
from pserver.plan.config import OptimConfig

RULES = ("sgd", "momentum", "nesterov", "adagrad")

#: Elements per piece of a fused copy-and-step (:meth:`Updater.step_from`): 256 KiB of float32,
#: so the piece just copied is still in the core's L2 cache when the step reads it again. A
#: multiple of every SIMD width, so each piece is stepped exactly as the whole block would be.
FUSED_PIECE = 1 << 16

# CUDA sources of the fused kernels: (input params, output params, body). ``T`` is bound to the
# block's dtype by the array arguments, so the scalars ``lr``, ``m``, ``wd``, ``eps`` are cast
# to it, as on the numpy path. Each body is the docstring's formula, line for line.
_KERNEL_SOURCES: dict[str, tuple[str, str, str]] = {
    "sgd": (
        "T g, T lr, T wd",
        "T w",
        "T d = g + wd * w;  w -= lr * d;",
    ),
    "momentum": (
        "T g, T lr, T m, T wd",
        "T w, T v",
        "T d = g + wd * w;  v = m * v + d;  w -= lr * v;",
    ),
    "nesterov": (
        "T g, T lr, T m, T wd",
        "T w, T v",
        "T d = g + wd * w;  v = m * v + d;  w -= lr * (d + m * v);",
    ),
    "adagrad": (
        "T g, T lr, T eps, T wd",
        "T w, T h",
        "T d = g + wd * w;  h += d * d;  w -= (lr * d) / (sqrt(h) + eps);",
    ),
}

# No FMA contraction: keeps the GPU's rounding identical to the numpy path (see module docstring).
_KERNEL_OPTIONS = ("--fmad=false",)

# Compiled lazily on first use (compiling needs a device and takes a while) and shared by every
# updater in the process; CuPy itself caches the binary per device.
_KERNELS: dict[str, Any] = {}


def _kernel(rule: str) -> Any:
    """The fused CuPy kernel of ``rule``, created on first use."""
    kernel = _KERNELS.get(rule)
    if kernel is None:
        import cupy  # lazy: this module must import on machines without CuPy

        in_params, out_params, body = _KERNEL_SOURCES[rule]
        kernel = cupy.ElementwiseKernel(
            in_params, out_params, body, name=f"pserver_{rule}", options=_KERNEL_OPTIONS
        )
        _KERNELS[rule] = kernel
    return kernel


def _is_cupy(xp: Any) -> bool:
    return getattr(xp, "__name__", "") == "cupy"


class Updater:
    """Applies one rule to one parameter block of ``size`` elements, in place.

    ``w`` and ``g`` passed to :meth:`step` are contiguous 1-D arrays of ``size`` elements of the
    updater's dtype, on the updater's backend. ``g`` is scratch: the caller does not reuse it, so
    the numpy path overwrites it instead of allocating a temporary.
    """

    def __init__(
        self,
        rule: str,
        size: int,
        xp: Any,
        dtype: Any,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        if rule not in RULES:
            raise ConfigError(f"optim.rule = {rule!r}: expected one of {', '.join(RULES)}")
        self.rule = rule
        self.size = int(size)
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.eps = float(eps)
        self._gpu = _is_cupy(xp)
        # Optimizer state starts at zero, as in PyTorch (the first momentum step is plain SGD).
        self._state: dict[str, Any] = {}
        if rule in ("momentum", "nesterov"):
            self._state["velocity"] = xp.zeros(self.size, dtype=self.dtype)
        elif rule == "adagrad":
            self._state["sum_sq"] = xp.zeros(self.size, dtype=self.dtype)
        # One temporary for the numpy path's products; the fused kernels need none.
        self._scratch = None if self._gpu else np.empty(self.size, dtype=self.dtype)
        self._axpy = _blas_axpy(self.dtype) if rule == "sgd" and not self._gpu else None
        self._numpy_step = {
            "sgd": self._sgd,
            "momentum": self._momentum,
            "nesterov": self._nesterov,
            "adagrad": self._adagrad,
        }[rule]

    def step(self, w: Any, g: Any, lr: float) -> None:
        """``w -= update(g)`` in place, advancing the optimizer state; ``g`` may be clobbered."""
        if w.shape != (self.size,) or g.shape != (self.size,):
            raise ValueError(
                f"{self.rule} updater of {self.size} elements got w {w.shape}, g {g.shape}"
            )
        if self._gpu:
            self._fused_step(w, g, lr)
        else:
            self._numpy_step(w, g, lr)

    @property
    def fuses_copy(self) -> bool:
        """Whether :meth:`step_from` is one pass over memory (plain SGD through BLAS on the
        host), cheaper than a copy then :meth:`step`; other rules copy, then step."""
        return self._axpy is not None

    def step_from(self, w: Any, src: Any, g: Any, lr: float) -> None:
        """``w = src`` stepped by ``g``: the update written into another buffer (a new version of
        the weights, ``pserver.protocols.versions``), ``src`` left as it was.

        The same arithmetic as ``copyto(w, src); step(w, g, lr)``, bit for bit. For plain SGD on
        the host it runs piece by piece (``FUSED_PIECE``): each piece is copied, then stepped
        while still in cache, so the block crosses memory once (read ``src`` and ``g``, write
        ``w``) instead of twice (docs/performance.md, *The server path at the memory limit*).
        """
        axpy = self._axpy
        if (
            axpy is None
            or w.shape != (self.size,)
            or not (w.flags.c_contiguous and src.flags.c_contiguous and g.flags.c_contiguous)
        ):
            self.xp.copyto(w, src)
            self.step(w, g, lr)
            return
        wd = self.weight_decay
        for start in range(0, self.size, FUSED_PIECE):
            piece = slice(start, start + FUSED_PIECE)
            wp, gp = w[piece], g[piece]
            np.copyto(wp, src[piece])
            if wd:
                _in_place(axpy(wp, gp, a=wd), gp)  # d = g + wd * w
            _in_place(axpy(gp, wp, a=-lr), wp)  # w -= lr * d

    def state_arrays(self) -> dict[str, Any]:
        """The live state buffers by name, for checkpoints (empty for SGD).

        These are the updater's own arrays, not copies: to restore a checkpoint, copy into them
        (``xp.copyto(updater.state_arrays()["velocity"], saved)``).
        """
        return dict(self._state)

    # -- CuPy: one kernel launch per step --------------------------------------------------------

    def _fused_step(self, w: Any, g: Any, lr: float) -> None:
        kernel = _kernel(self.rule)
        wd = self.weight_decay
        if self.rule == "sgd":
            kernel(g, lr, wd, w)
        elif self.rule == "adagrad":
            kernel(g, lr, self.eps, wd, w, self._state["sum_sq"])
        else:
            kernel(g, lr, self.momentum, wd, w, self._state["velocity"])

    # -- numpy: the same expressions, each written into preallocated memory ----------------------

    def _decay(self, w: np.ndarray, g: np.ndarray) -> None:
        """``g = g + wd * w`` (skipped when wd is 0: adding 0 * w changes nothing finite)."""
        if self.weight_decay:
            np.multiply(self.weight_decay, w, out=self._scratch)
            g += self._scratch

    def _sgd(self, w: np.ndarray, g: np.ndarray, lr: float) -> None:
        axpy = self._axpy
        if axpy is not None and w.flags.c_contiguous and g.flags.c_contiguous:
            if self.weight_decay:
                _in_place(axpy(w, g, a=self.weight_decay), g)  # d = g + wd * w
            _in_place(axpy(g, w, a=-lr), w)  # w -= lr * d
            return
        self._decay(w, g)
        np.multiply(lr, g, out=g)
        w -= g

    def _momentum(self, w: np.ndarray, g: np.ndarray, lr: float) -> None:
        v = self._state["velocity"]
        self._decay(w, g)
        np.multiply(self.momentum, v, out=v)
        v += g
        np.multiply(lr, v, out=g)
        w -= g

    def _nesterov(self, w: np.ndarray, g: np.ndarray, lr: float) -> None:
        v = self._state["velocity"]
        self._decay(w, g)
        np.multiply(self.momentum, v, out=v)
        v += g
        np.multiply(self.momentum, v, out=self._scratch)
        g += self._scratch
        np.multiply(lr, g, out=g)
        w -= g

    def _adagrad(self, w: np.ndarray, g: np.ndarray, lr: float) -> None:
        h, s = self._state["sum_sq"], self._scratch
        self._decay(w, g)
        np.multiply(g, g, out=s)
        h += s
        np.sqrt(h, out=s)
        s += self.eps
        np.multiply(lr, g, out=g)
        np.divide(g, s, out=g)
        w -= g


def _blas_axpy(dtype: np.dtype) -> Any:
    """BLAS ``y += a * x`` for ``dtype`` (from SciPy, which scikit-learn brings), or None."""
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    try:
        from scipy.linalg.blas import get_blas_funcs
    except ImportError:  # the two NumPy passes do the same
        return None
    limit_late_blas()  # SciPy's own OpenBLAS may have loaded just now
    return get_blas_funcs("axpy", dtype=dtype)


def preload(rule: str, xp: Any, dtype: Any) -> None:
    """Load now what the first :meth:`Updater.step` of ``rule`` would import (SciPy's BLAS).

    A shard calls this before the start barrier: imported at the first update instead, SciPy's
    import delays that update while overlapped learners go on computing from w0, so the first
    gradients arrive very stale (docs/performance.md, "Importing SciPy before the start").
    The BLAS thread limit reaches SciPy's own OpenBLAS here too (:func:`_blas_axpy`).
    """
    if rule == "sgd" and not _is_cupy(xp):
        _blas_axpy(np.dtype(dtype))


def _in_place(result: np.ndarray, target: np.ndarray) -> None:
    """f2py returns ``y`` itself when it could work in place; anything else is a bug here."""
    if result is not target:
        raise RuntimeError("BLAS axpy did not update the block in place")


def scheduled_lr(cfg: OptimConfig, epoch: float) -> float:
    """The base learning rate at (0-based, fractional) epoch ``epoch``: the samples counted
    before this step over the epoch's samples (2.5 is halfway through the third epoch).

    α0 · w(e) · γ^k · d^j, with

    * w(e) the linear warm-up: from ``warmup_start``·α0 at e = 0 to α0 at e =
      ``warmup_epochs`` (fractional allowed), 1 afterwards and when ``warmup_epochs`` is 0.
      PP-ASGD (Sato et al. §4, footnote 5) varies the rate "from 0 to the target value linearly
      from the beginning of the training until the end of the first epoch" (``warmup_epochs =
      1``, ``warmup_start = 0``); IBM (Zhang et al. §3.1) warms the base rate from 0.1 to 1 in
      the first 10 epochs (``warmup_epochs = 10``, ``warmup_start = 0.1``, ``lr = 1``);
    * γ^k the step decay, k the milestones ≤ ⌊e⌋ (``lr_milestones``, ``lr_gamma``; PyTorch's
      ``MultiStepLR`` stepped once per epoch);
    * d^j the per-epoch annealing, j = ⌊e⌋ − ``lr_decay_from`` + 1 epochs from that epoch on
      (``lr_decay``; IBM anneals by 1/√2 every epoch from the 11th: ``lr_decay = 0.7071``,
      ``lr_decay_from = 10``).

    With the defaults (no warm-up, d = 1) the rate is exactly α0 · γ^k, as before the warm-up
    existed. The protocols' own scaling (Rudra eq. 6, hardsync's √(λμ/B)) multiplies this rate.
    """
    k = sum(1 for m in cfg.lr_milestones if m <= epoch)
    rate = cfg.lr * cfg.lr_gamma**k
    whole = math.floor(epoch)
    if cfg.lr_decay != 1.0 and whole >= cfg.lr_decay_from:
        rate *= cfg.lr_decay ** (whole - cfg.lr_decay_from + 1)
    if epoch < cfg.warmup_epochs:
        rate *= cfg.warmup_start + (1.0 - cfg.warmup_start) * epoch / cfg.warmup_epochs
    return rate


def make_updater(cfg: OptimConfig, size: int, xp: Any, dtype: Any) -> Updater:
    """The updater ``cfg.rule`` for a block of ``size`` elements of ``dtype`` on backend ``xp``.

    ``cfg.lr`` is not captured: the server passes the learning rate to every step, because
    protocols scale it (e.g. by staleness or by the number of gradients aggregated).
    """
    if np.dtype(dtype).kind != "f":
        raise ConfigError(f"update rules need a floating-point dtype, got {np.dtype(dtype)}")
    if size <= 0:
        raise ConfigError(f"a parameter block needs at least one element, got size {size}")
    return Updater(
        cfg.rule,
        size,
        xp,
        dtype,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        eps=cfg.eps,
    )
