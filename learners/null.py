"""A model that computes nothing, for benchmarks of the communication alone.

It has ``size_mib`` MiB of parameters and leaves its gradient buffer as it is (zeros after the
first fill), so a learner's step costs only the push and the pull.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy

from learners.models import Model


class NullModel(Model):
    def __init__(
        self, n_params: int, n_classes: int, dtype: str = "float32", xp: ModuleType = numpy
    ):
        self.n_params, self.n_classes = n_params, n_classes
        self.layer_sizes = [n_params]
        self.dtype, self.xp = numpy.dtype(dtype), xp

    def init_params(self, seed: int) -> numpy.ndarray:
        return numpy.zeros(self.n_params, self.dtype)

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        return 0.0, 1.0 - 1.0 / self.n_classes

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        return 0.0, 1.0 - 1.0 / self.n_classes
