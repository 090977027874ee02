"""A LeNet-style PyTorch CNN for Fashion-MNIST (``examples/fashion.toml``, docs/study.md).

    28 x 28 -> conv 5x5 (16) -> ReLU -> max-pool 2 -> conv 5x5 (32) -> ReLU -> max-pool 2
            -> dense (10)

29k parameters, about 0.3 ms of one core per sample for the forward and backward pass; small
CNNs of this kind reach 90-92 % test accuracy on Fashion-MNIST (its benchmark table), the MLP
of the quickstart about 86 %.
"""

import math

from torch import nn


def build(n_features: int, n_classes: int) -> nn.Module:
    side = math.isqrt(n_features)  # Fashion-MNIST: 28 x 28
    if side * side != n_features or side % 4:
        raise ValueError(f"expected square images with a side divisible by 4, got {n_features}")
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 16, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (side // 4) ** 2, n_classes),
    )
