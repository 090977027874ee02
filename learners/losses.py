"""Losses shared by the models, written against an array module ``xp`` (numpy or CuPy)."""

from __future__ import annotations

from collections.abc import Callable
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


def evaluate_in_batches(
    xp: ModuleType, logits_of: Callable[[Any], Any], X: Any, y: Any, batch: int
) -> tuple[float, float]:
    """Mean cross-entropy and error rate over a whole set, ``batch`` samples at a time;
    ``logits_of(X_batch)`` is the model's forward pass."""
    n = X.shape[0]
    if n == 0:
        raise ValueError("cannot evaluate on an empty set")
    total_loss = total_err = 0.0
    for a in range(0, n, batch):
        logits = logits_of(X[a : a + batch])
        loss, err, _ = cross_entropy(xp, logits, y[a : a + batch], want_grad=False)
        m = logits.shape[0]
        total_loss += loss * m
        total_err += err * m
    return total_loss / n, total_err / n
