"""Verdicts on the papers' accuracy claims from runs over several seeds (issue 25, item 6).

Pure: numbers in, a :class:`Verdict` out; the ``reproduce_*`` drivers feed it their runs'
figures (one value per seed) and print :meth:`Verdict.line`. Every verdict says which rule
decided it, so a reader can disagree with the rule and not only with the outcome:

* :func:`lower`    -- x is below y: mean(x) < mean(y) and Welch's one-sided t-test gives
                      p < ``ALPHA`` (a difference larger than the seeds' spread explains);
* :func:`no_worse` -- x is not above y: it fails only when mean(x) > mean(y) with p < ``ALPHA``;
* :func:`within`   -- x and y are about the same: |mean(x) − mean(y)| <= a stated margin;
* :func:`saving`   -- x takes at least a share less than y: 1 − mean(x)/mean(y) >= the share,
                      and :func:`lower` holds;
* :func:`both`     -- a claim made of parts holds when every part does.

A sample with fewer than ``MIN_SEEDS`` values has no spread, so a claim on it is "not
tested" (e.g. a ``--quick`` run with one seed), as is a claim whose runs failed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ALPHA = 0.05  # the t-test's level
MIN_SEEDS = 2  # a spread needs two values; the drivers default to 3 seeds

HOLDS, FAILS, UNTESTED = "holds", "does not hold", "not tested"


@dataclass(frozen=True)
class Sample:
    """One figure of one setting over seeds (NaNs, from failed runs, left out)."""

    label: str
    values: tuple[float, ...]
    scale: float = 1.0  # printed as value × scale: 100 for an error printed in %
    unit: str = ""
    spec: str = ".2f"

    @classmethod
    def of(cls, label: str, values: Iterable[float], **kw: object) -> Sample:
        kept = tuple(float(v) for v in values if v is not None and not math.isnan(float(v)))
        return cls(label, kept, **kw)  # type: ignore[arg-type]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / self.n if self.n else math.nan

    @property
    def std(self) -> float:
        """The sample standard deviation (n − 1); NaN under two values."""
        if self.n < 2:
            return math.nan
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))

    def __str__(self) -> str:
        return f"{self.label} {mean_std(self)}"


def mean_std(s: Sample) -> str:
    """``12.34 ± 0.56 % (3 seeds)``: the error bar the docs' table and the drivers print."""
    if s.n == 0:
        return "n/a (no finished run)"
    m = format(s.mean * s.scale, s.spec)
    sd = "" if s.n < 2 else f" ± {format(s.std * s.scale, s.spec)}"
    unit = f" {s.unit}" if s.unit else ""
    return f"{m}{sd}{unit} ({s.n} seed{'s' if s.n != 1 else ''})"


@dataclass(frozen=True)
class Verdict:
    """One claim of a paper and whether these runs show it."""

    where: str  # the paper's table or figure, e.g. "PSP-SGD Table 1"
    claim: str
    status: str  # HOLDS, FAILS or UNTESTED
    numbers: str
    rule: str

    @property
    def holds(self) -> bool | None:
        return {HOLDS: True, FAILS: False}.get(self.status)

    def line(self) -> str:
        head = f"[{self.status}] {self.where}: {self.claim}"
        return f"{head}\n    {self.numbers}\n    rule: {self.rule}"


def not_tested(where: str, claim: str, why: str) -> Verdict:
    """A claim these runs cannot show (too few learners or seeds, failed runs): ``why``."""
    return Verdict(where, claim, UNTESTED, why, "-")


def judged(where: str, claim: str, holds: bool | None, numbers: str, rule: str) -> Verdict:
    """A verdict from a rule the caller applied (None: not tested)."""
    status = UNTESTED if holds is None else HOLDS if holds else FAILS
    return Verdict(where, claim, status, numbers, rule)


def too_few(*samples: Sample) -> str:
    """Why these samples cannot decide ("" when each has ``MIN_SEEDS`` values)."""
    short = [s for s in samples if s.n < MIN_SEEDS]
    if not short:
        return ""
    return "too few seeds for a spread: " + ", ".join(f"{s.label} {s.n}" for s in short)


# -- Welch's t-test -----------------------------------------------------------------------------


def welch(x: Sample, y: Sample) -> tuple[float, float]:
    """Welch's t of mean(x) − mean(y) and its degrees of freedom (Welch–Satterthwaite).

    Two samples without any spread give t = ±inf (or 0 for equal means) and df = n_x + n_y − 2.
    """
    vx, vy = x.std**2 / x.n, y.std**2 / y.n
    diff = x.mean - y.mean
    se2 = vx + vy
    if se2 == 0:
        return (math.copysign(math.inf, diff) if diff else 0.0), float(x.n + y.n - 2)
    df = se2**2 / (vx**2 / (x.n - 1) + vy**2 / (y.n - 1))
    return diff / math.sqrt(se2), df


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (regularized incomplete beta)."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def p_below(x: Sample, y: Sample) -> float:
    """One-sided p-value of "mean(x) < mean(y)" (Welch)."""
    t, df = welch(x, y)
    return t_sf(-t, df)


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b) by its continued fraction (Lentz), the symmetric form past the mean."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))  # fmt: skip
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return math.exp(log_front) * (f - 1.0) / a


# -- rules --------------------------------------------------------------------------------------


def _welch_rule(x: Sample, y: Sample, sign: str) -> str:
    return (f"Welch one-sided t-test, mean({x.label}) {sign} mean({y.label}) "
            f"at p < {ALPHA:g}")  # fmt: skip


def lower(where: str, claim: str, x: Sample, y: Sample) -> Verdict:
    """x below y: its mean is lower and Welch's one-sided test gives p < ALPHA."""
    if why := too_few(x, y):
        return not_tested(where, claim, f"{x}; {y}: {why}")
    p = p_below(x, y)
    holds = x.mean < y.mean and p < ALPHA
    return judged(where, claim, holds, f"{x}; {y}; p = {p:.3g}", _welch_rule(x, y, "<"))


def no_worse(where: str, claim: str, x: Sample, y: Sample) -> Verdict:
    """x not above y: fails only when x's mean is higher with Welch's p < ALPHA."""
    if why := too_few(x, y):
        return not_tested(where, claim, f"{x}; {y}: {why}")
    p = p_below(y, x)
    worse = x.mean > y.mean and p < ALPHA
    rule = f"fails only if {_welch_rule(x, y, '>')}"
    return judged(where, claim, not worse, f"{x}; {y}; p = {p:.3g}", rule)


def within(where: str, claim: str, x: Sample, y: Sample, margin: float) -> Verdict:
    """About the same: |mean(x) − mean(y)| <= ``margin`` (in the samples' own units)."""
    if why := too_few(x, y):
        return not_tested(where, claim, f"{x}; {y}: {why}")
    diff = x.mean - y.mean
    shown = format(diff * x.scale, "+" + x.spec)
    unit = f" {x.unit}" if x.unit else ""
    rule = f"|mean difference| <= {format(margin * x.scale, x.spec)}{unit}"
    return judged(where, claim, abs(diff) <= margin, f"{x}; {y}; difference {shown}{unit}", rule)


def saving(where: str, claim: str, x: Sample, y: Sample, share: float) -> Verdict:
    """x takes at least ``share`` less than y (1 − mean(x)/mean(y)), and :func:`lower` holds."""
    if why := too_few(x, y):
        return not_tested(where, claim, f"{x}; {y}: {why}")
    saved = 1.0 - x.mean / y.mean if y.mean else math.nan
    p = p_below(x, y)
    holds = saved >= share and p < ALPHA
    rule = f"saving >= {share:.0%} and {_welch_rule(x, y, '<')}"
    return judged(where, claim, holds, f"{x}; {y}; saving {saved:+.1%}, p = {p:.3g}", rule)


def both(where: str, claim: str, *parts: Verdict) -> Verdict:
    """A claim of several parts: holds when all hold, fails when one fails, else not tested."""
    statuses = {v.status for v in parts}
    status = FAILS if FAILS in statuses else UNTESTED if UNTESTED in statuses else HOLDS
    numbers = "\n    ".join(f"{v.claim}: [{v.status}] {v.numbers}" for v in parts)
    rule = "every part holds: " + "; ".join(dict.fromkeys(v.rule for v in parts))
    return Verdict(where, claim, status, numbers, rule)


def report(verdicts: Sequence[Verdict]) -> str:
    """The lines a driver prints: one per claim, then a count."""
    counts = {s: sum(v.status == s for v in verdicts) for s in (HOLDS, FAILS, UNTESTED)}
    tail = ", ".join(f"{s}: {n}" for s, n in counts.items() if n)
    return "\n".join(["The paper's claims on these runs:", *(v.line() for v in verdicts),
                      f"{len(verdicts)} claims: {tail}"])  # fmt: skip
