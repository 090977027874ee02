"""A model that computes nothing, for benchmarks of the communication alone.

It has ``size_mib`` MiB of parameters and a gradient of zeros, so a learner's step costs the
push, the pull and one ``memset`` of the gradient, at memory bandwidth (docs/performance.md).
The gradient is written every step: a learner's gradient buffers
come from ``empty`` and, under ``comm.transport = "shm"``, the shard's update may use the
learner's slot as scratch, so "zeros after the first fill" does not hold. Left unwritten, a
run pushed whatever the memory held (NaN in the final weights of 6 of 15 soak runs). With
w0 = 0 every update rule keeps the weights at exactly 0.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy

from learners.contract import Model


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
        grad.fill(0)
        return 0.0, 1.0 - 1.0 / self.n_classes

    def evaluate(self, w: Any, X: Any, y: Any, batch: int = 1024) -> tuple[float, float]:
        return 0.0, 1.0 - 1.0 / self.n_classes
