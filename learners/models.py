"""The models' public names in one place (kept so that callers need no change).

The contract lives in :mod:`learners.contract`, the fully connected models in
:mod:`learners.mlp`, the convolutional one in :mod:`learners.cnn`, the benchmark model in
:mod:`learners.null`, and ``model.kind`` -> model in :mod:`learners.factory`. No module of
``learners/`` imports this one, so there is no import cycle among them.
"""

from __future__ import annotations

from learners.contract import DTYPES, Model
from learners.factory import build_model
from learners.losses import cross_entropy
from learners.mlp import MLP, Softmax

__all__ = ["DTYPES", "MLP", "Model", "Softmax", "build_model", "cross_entropy"]
