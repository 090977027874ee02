"""Losses shared by the models, written against an array module ``xp`` (numpy or CuPy)."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def cross_entropy(xp: ModuleType, logits: Any, y: Any, want_grad: bool) -> tuple[float, float, Any]:
    """Mean loss, error rate and (if wanted) d(mean loss)/d(logits), computed stably."""
    n = logits.shape[0]
    rows = xp.arange(n)
    shifted = logits - xp.max(logits, axis=1, keepdims=True)
    e = xp.exp(shifted)
    s = xp.sum(e, axis=1, keepdims=True)
    loss = float(xp.mean(xp.log(s[:, 0]) - shifted[rows, y]))
    err = float(xp.mean(xp.argmax(logits, axis=1) != y))
    if not want_grad:
        return loss, err, None
    e /= s
    e[rows, y] -= 1
    e /= n
    return loss, err, e
