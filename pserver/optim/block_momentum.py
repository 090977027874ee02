"""Blockwise model-update filtering (BMUF, Chen & Huo): the master's arithmetic, pure.

One :class:`BlockMomentum` per parameter block at the shard (the master). After block ``t``
every learner has run τ local steps from the global model ``W_g(t−1)`` it pulled; the mean of
their local models is W̄(t), and

* G(t) = W̄(t) − W_g(t−1)                           (eq. 2)
* Δ(t) = η·Δ(t−1) + ζ·G(t),   0 ≤ η < 1, ζ > 0     (eq. 3)
* W(t) = W(t−1) + Δ(t)                              (eq. 4)

and serves, for the next block,

* W_g(t) = W(t)                                     (eq. 5, classical block momentum, CBM)
* W_g(t) = W(t) + η·Δ(t)                            (eq. 6, Nesterov block momentum, NBM)

η = 0, ζ = 1 is model averaging (MA): then W_g(t−1) = W(t−1) and W(t) = W̄(t), which
:meth:`BlockMomentum.step` takes as it is ("the strategy of MA", §2.1.3) rather than as
W(t−1) + (W̄(t) − W(t−1)): the two differ in the last bit where a local step's fused
multiply-add (BLAS ``axpy``) left W̄ − W inexact, and a one-learner MA run with τ = 1 is then
serial SGD bit for bit. The default η = 1 − 1/λ is eq. (10),
ζ / (λ(1 − η)) = C, with ζ = 1 and C = 1 (:func:`default_block_momentum`).

These are the paper's equations, not the popular implementations': fairseq's and CNTK's
Nesterov variants keep only the look-ahead model and never subtract η·Δ(t−1) from it, which
amounts to another filter (a total gain of 15 instead of the paper's 8 at η = 0.875). Here W(t)
and Δ(t) are kept apart; the look-ahead is only ever written to the buffer pulls read, and the
model the statistics server tests is W(t).

Every operation writes into preallocated memory (``out=``); arrays of any backend (``xp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def default_block_momentum(n_learners: int, block_lr: float = 1.0, gain: float = 1.0) -> float:
    """η from eq. (10), ζ / (λ(1 − η)) = C: η = 1 − ζ/(C·λ); with ζ = C = 1, 1 − 1/λ."""
    return 1.0 - block_lr / (gain * n_learners)


@dataclass(frozen=True)
class Filter:
    """The block-level parameters: τ local steps, η (block momentum), ζ (block learning rate)
    and whether the served model is the Nesterov look-ahead (eq. 6) or W(t) itself (eq. 5)."""

    tau: int
    eta: float
    zeta: float
    nesterov: bool

    @property
    def looks_ahead(self) -> bool:
        """Whether the served model differs from W(t) (NBM with η > 0)."""
        return self.nesterov and self.eta > 0.0


@dataclass(frozen=True)
class Norms:
    """‖G(t)‖ and ‖Δ(t)‖ of one block's update (the ``rounds`` row of the dump)."""

    g: float
    delta: float


class BlockMomentum:
    """Δ, the scratch of the look-ahead, and the step of eqs. (3)–(4) for one block."""

    def __init__(self, flt: Filter, size: int, xp: Any, dtype: Any) -> None:
        self.filter, self.xp = flt, xp
        self.delta = xp.zeros(size, dtype=dtype)  # Δ(t−1); Δ(0) = 0, so W_g(0) = W(0)
        self.ahead = xp.empty(size, dtype=dtype) if flt.looks_ahead else None

    def state_arrays(self) -> dict[str, Any]:
        """Δ(t), the state a checkpoint keeps (``pserver.ckpt.records.shard``, as an update rule's);
        the look-ahead is scratch, written from W and Δ at every serve."""
        return {"delta": self.delta}

    @property
    def averages(self) -> bool:
        """η = 0 and ζ = 1: model averaging, W(t) = W̄(t)."""
        return self.filter.eta == 0.0 and self.filter.zeta == 1.0

    def step(self, w: Any, mean: Any) -> Norms:
        """Eqs. (2)–(4) in place on W = ``w``, from W̄(t) = ``mean`` (clobbered: becomes G)."""
        xp, f, d = self.xp, self.filter, self.delta
        if self.averages:  # Δ(t) = G(t) = W̄(t) − W(t−1), and W(t) = W̄(t)
            xp.subtract(mean, w, out=d)
            xp.copyto(w, mean)
            norm = float(xp.linalg.norm(d))
            return Norms(norm, norm)
        g = xp.subtract(mean, self.served(w), out=mean)  # eq. (2), against W_g(t−1)
        g_norm = float(xp.linalg.norm(g))
        xp.multiply(d, f.eta, out=d)
        if f.zeta != 1.0:
            xp.multiply(g, f.zeta, out=g)
        xp.add(d, g, out=d)
        xp.add(w, d, out=w)
        return Norms(g_norm, float(xp.linalg.norm(d)))

    def served(self, w: Any, out: Any = None) -> Any:
        """W_g(t), the model the next block starts from: eq. (6) for NBM, eq. (5) for CBM.
        Written into ``out`` when given, else returned (``w`` itself, or the scratch)."""
        xp = self.xp
        if not self.filter.looks_ahead:
            if out is None:
                return w
            xp.copyto(out, w)
            return out
        out = self.ahead if out is None else out
        xp.multiply(self.delta, self.filter.eta, out=out)
        xp.add(w, out, out=out)
        return out
