"""What a model is to the rest of pserver: one flat parameter vector, a loss and its gradient.

Every model (:mod:`learners.mlp`, :mod:`learners.cnn`, :mod:`learners.null`, a user's own) is a
:class:`Model`; the roles see nothing else of it. Pure: no MPI, nothing from ``pserver.comm``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy

DTYPES = ("float32", "float64")


class Model:
    """A classifier whose parameters are one flat vector (the protocol the roles rely on)."""

    n_params: int
    layer_sizes: list[int]  # parameter count of each tensor, in flat order
    dtype: numpy.dtype
    xp: ModuleType

    def init_params(self, seed: int) -> numpy.ndarray:
        """A fresh host (numpy) flat parameter vector, deterministic from ``seed``."""
        raise NotImplementedError

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        """Mean cross-entropy and error rate on the batch; write d(mean loss)/dw into ``grad``."""
        raise NotImplementedError

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        """Mean loss and error rate over a whole set, computed ``batch`` samples at a time."""
        raise NotImplementedError

    def activation_bytes(self) -> int:
        """Bytes one sample's forward and backward pass allocates (for the memory check)."""
        return 0
