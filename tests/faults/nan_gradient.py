"""A plain model (docs/models.md) whose gradient turns infinite once, on one rank, with a
finite loss: the test of issue 22's D6 under MPI (tests/test_mpi_nonfinite.py).

``NAN_RANK`` (the world rank, as the launcher numbers it) and ``NAN_CALL`` (its n-th
``loss_grad``) come from the environment; every other call is the example softmax's.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from numpy_softmax import NumpySoftmax  # noqa: E402

RANK = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))


class InfOnce(NumpySoftmax):
    def __init__(self, n_features: int, n_classes: int):
        super().__init__(n_features, n_classes)
        self.calls = 0

    def loss_grad(self, w, X, y, grad_out) -> float:
        loss = super().loss_grad(w, X, y, grad_out)
        self.calls += 1
        if RANK == os.environ.get("NAN_RANK") and self.calls == int(os.environ["NAN_CALL"]):
            grad_out[3] = float("inf")  # the loss stays finite: only the gradient says it
        return loss
