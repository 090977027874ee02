"""PP-ASGD's parameter prediction (Sato et al. 2017): the arithmetic, pure (no MPI).

A learner's gradient, computed on the weights of timestamp t, is applied S updates later, to
w_{t+S} (S: its staleness σ). PP-ASGD serves, instead of w_t, the weights the momentum alone
would carry them to by then (the paper's eq. (2)):

    f_S(w_t, M_t) = w_t + M_t · Σ_{s=1}^{S+1} μ^s

with M_t the paper's momentum term (its Algorithm 2: M ← μM − λD, w ← w + M) and
S = ⌊S̄⌋, S̄ the time-average staleness. With S = 0 this is Nesterov's look-ahead w + μM
(the paper's Algorithm 4, line 15).

The server's update rules (``pserver.optim.rules``) keep a velocity v instead of M:

* ``momentum``: v ← μv + d, w ← w − α·v. The step is −α·v, so M = −α·v.
* ``nesterov``: v ← μv + d, w ← w − α·(d + μv). With no new gradient (d = 0) the next step is
  −α·μ·v_{t+1} = μ·(−α·μ·v_t), so the momentum term of the transition is M = −α·μ·v.

α is the learning rate of the last update (its schedule and the protocol's staleness scaling
included): the prediction extrapolates the last step. So f_S(w, M) = w + k·v with one scalar
k = −α·(μ if nesterov else 1)·Σ_{s=1}^{S+1} μ^s (:func:`velocity_coefficient`), one pass over
the block (:func:`predict`).

S̄ comes from the staleness the server measures: the running mean, over the last
:data:`WINDOW` updates, of each update's mean staleness ⟨σ⟩ (Rudra, Gupta et al. eq. (2))
(:class:`StalenessMean`). The paper's own estimate S̄ = 1 + F_U/F_G (its eq. (1), update
frequency over one learner's gradient frequency) is :func:`paper_staleness`, printed beside it.

Fig. 3-right's quantity, ‖w_{t+S+1} − f_S(w_t)‖ (the prediction against the weights that came
S+1 updates later: the gradient computed on f_S(w_t) produces w_{t+S+1}), is measured by
:class:`ErrorProbe` from three dot products, which give it for every S at once:
‖d − a_S·M‖² = d·d − 2·a_S·d·M + a_S²·M·M, with d = w_{t+H} − w_t and a_S = Σ_{s=1}^{S+1} μ^s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

#: updates whose mean staleness the running mean S̄ averages
WINDOW = 64
#: the update rules with a momentum term to extrapolate
RULES = ("momentum", "nesterov")


def horizon_sum(mu: float, steps: int) -> float:
    """Σ_{s=1}^{S+1} μ^s, S = ``steps`` ≥ 0 (the coefficient of M in eq. (2))."""
    if steps < 0:
        raise ValueError(f"prediction steps must be >= 0, got {steps}")
    return sum(mu**s for s in range(1, steps + 2))


def momentum_scale(rule: str, mu: float, lr: float) -> float:
    """c with M = c·v, the paper's momentum term from ``rule``'s velocity (see the module)."""
    if rule not in RULES:
        raise ValueError(f"prediction needs a momentum rule ({', '.join(RULES)}), got {rule!r}")
    return -lr * (mu if rule == "nesterov" else 1.0)


def velocity_coefficient(rule: str, mu: float, lr: float, steps: int) -> float:
    """k with f_S(w, M) = w + k·v for the velocity v of ``rule`` (see the module)."""
    return momentum_scale(rule, mu, lr) * horizon_sum(mu, steps)


def predict(w: Any, v: Any, k: float, out: Any, xp: Any = np) -> Any:
    """``out`` = w + k·v (``out`` may not be ``w``); returns ``out``. The product is rounded to
    the block's dtype first, then the sum: the serial reference calls this same function."""
    xp.multiply(v, w.dtype.type(k), out=out)
    out += w
    return out


def steps_of(mean: float) -> int:
    """S = ⌊S̄⌋ (never below 0)."""
    return max(0, math.floor(mean))


class StalenessMean:
    """The running mean S̄ of the last ``window`` updates' mean staleness ⟨σ⟩ (0 before any)."""

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.recent: deque[float] = deque(maxlen=window)
        self.total = 0.0

    def add(self, mean_staleness: float) -> None:
        self.recent.append(float(mean_staleness))
        self.total = float(sum(self.recent))  # re-summed: no drift over long runs

    @property
    def value(self) -> float:
        return self.total / len(self.recent) if self.recent else 0.0


def paper_staleness(updates: int, gradients: int, learners: int) -> float:
    """The paper's eq. (1), S̄ = 1 + F_U/F_G, over one run: F_U = updates / T and
    F_G = gradients / (λ·T) (one learner's gradient rate), so F_U/F_G = λ·updates/gradients."""
    return 1.0 + (learners * updates / gradients if gradients else 0.0)


def error_sq(dd: float, dm: float, mm: float, a: float) -> float:
    """‖d − a·M‖² from d·d, d·M and M·M (clipped at 0 against rounding)."""
    return max(0.0, dd - 2.0 * a * dm + a * a * mm)


def prediction_error(dd: float, dm: float, mm: float, mu: float, steps: int) -> float:
    """‖w_{t+H} − f_S(w_t, M_t)‖ for S = ``steps`` from the probe's three dot products."""
    return math.sqrt(error_sq(dd, dm, mm, horizon_sum(mu, steps)))


@dataclass(frozen=True)
class ProbeResult:
    """One finished probe: from timestamp ``origin`` (served with S = ``steps``) to
    ``origin + horizon``; the dot products of d = w_{origin+horizon} − w_origin and M_origin."""

    origin: int
    steps: int
    horizon: int
    dd: float
    dm: float
    mm: float
    error: float  # ‖d − a_S·M‖ for the S served


class ErrorProbe:
    """Every ``every`` updates, keeps (w_t, M_t) and, S+1 updates later, measures how far the
    prediction served at t was from the weights that came (Fig. 3-right). One probe at a time;
    its two float64 buffers are allocated once."""

    def __init__(self, every: int, size: int, xp: Any = np) -> None:
        self.every, self.xp = every, xp
        self.w0 = xp.zeros(size, dtype=np.float64) if every else None
        self.m0 = xp.zeros(size, dtype=np.float64) if every else None
        self.origin = -1  # timestamp of the probe in flight, -1: none
        self.steps = 0
        self.due = -1

    def start(self, ts: int, w: Any, v: Any, per_step: float, steps: int) -> None:
        """At timestamp ``ts`` (after its update): start a probe when one is due and none runs.
        ``per_step``: M = per_step · v (:func:`momentum_scale`)."""
        if not self.every or self.origin >= 0 or ts % self.every:
            return
        self.w0[...] = w
        self.xp.multiply(v, per_step, out=self.m0)  # rounded in float64, not in the block's dtype
        self.origin, self.steps, self.due = ts, steps, ts + steps + 1

    def finish(self, ts: int, w: Any, mu: float) -> ProbeResult | None:
        """At timestamp ``ts``: the result of the probe that ends here, if one does."""
        if self.origin < 0 or ts < self.due:
            return None
        d = self.xp.asarray(w, dtype=np.float64) - self.w0  # once per probe: a temporary is fine
        dd, dm = float(self.xp.dot(d, d)), float(self.xp.dot(d, self.m0))
        mm = float(self.xp.dot(self.m0, self.m0))
        horizon = ts - self.origin
        result = ProbeResult(
            self.origin, self.steps, horizon, dd, dm, mm,
            prediction_error(dd, dm, mm, mu, self.steps),
        )  # fmt: skip
        self.origin = -1
        return result


class Predictor:
    """One block's prediction state: S̄, the S served, the last step's rate, the probe.

    ``fixed_steps`` ≥ 0 fixes S (``protocol.predict_steps``); −1 measures it (S = ⌊S̄⌋).
    ``probe_every``: updates between error probes (0: none).
    """

    def __init__(
        self, rule: str, mu: float, fixed_steps: int, probe_every: int, size: int, xp: Any = np
    ) -> None:
        momentum_scale(rule, mu, 0.0)  # refuses a rule without momentum
        self.rule, self.mu, self.fixed, self.xp = rule, mu, fixed_steps, xp
        self.mean = StalenessMean()
        self.probe = ErrorProbe(probe_every, size, xp)
        self.lr = 0.0
        self.steps = max(fixed_steps, 0)

    def after_update(
        self, ts: int, mean_staleness: float, lr: float, w: Any, v: Any
    ) -> ProbeResult | None:
        """Update t → ``ts`` is done (at rate ``lr``, with ⟨σ⟩ ``mean_staleness``): the S to
        serve w_ts with, and the probe that ends here, if any."""
        self.mean.add(mean_staleness)
        self.lr = lr
        self.steps = self.fixed if self.fixed >= 0 else steps_of(self.mean.value)
        result = self.probe.finish(ts, w, self.mu)
        self.probe.start(ts, w, v, momentum_scale(self.rule, self.mu, lr), self.steps)
        return result

    def serve(self, w: Any, v: Any, out: Any) -> Any:
        """f_S(w, M) into ``out`` (eq. (2)) with the S and rate of the last update."""
        k = velocity_coefficient(self.rule, self.mu, self.lr, self.steps)
        return predict(w, v, k, out, self.xp)
