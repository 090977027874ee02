"""A small PyTorch CNN for pserver (``model.kind = "torch"``, examples/torch_cnn.toml).

pserver calls ``build(n_features, n_classes)`` (either argument may be left out), takes the
module's parameters as views of its flat weight buffer and trains it with cross-entropy (return
``(module, loss_fn)`` to use another loss). Inputs arrive as rows of ``n_features`` values, so
the module reshapes them into square single-channel images itself.
"""

import math

from torch import nn


def build(n_features: int, n_classes: int) -> nn.Module:
    side = math.isqrt(n_features)  # the digits: 8 x 8
    if side * side != n_features:
        raise ValueError(f"expected square images, got {n_features} features per sample")
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * (side // 2) ** 2, n_classes),
    )


def build_mlp(n_features: int, n_classes: int) -> nn.Module:
    """A two-layer perceptron (the benchmark's other model)."""
    return nn.Sequential(nn.Linear(n_features, 128), nn.ReLU(), nn.Linear(128, n_classes))
