"""The kind -> model factory: ``model.kind`` and its keys to a :class:`~learners.contract.Model`.

A new kind of model is a new module implementing the contract and one branch here.
"""

from __future__ import annotations

from types import ModuleType

import numpy

from learners.cnn import build_cnn
from learners.contract import DTYPES, Model
from learners.mlp import MLP, Softmax
from learners.null import NullModel
from pserver.errors import ConfigError
from pserver.plan.config import ModelConfig


def build_model(cfg: ModelConfig, n_features: int, n_classes: int, xp: ModuleType = numpy) -> Model:
    """The model named by ``cfg.kind`` for ``n_features`` inputs and ``n_classes`` outputs."""
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"model.dtype = {cfg.dtype!r}: expected one of {', '.join(DTYPES)}")
    if n_features < 1 or n_classes < 2:
        raise ConfigError(
            f"a model needs >= 1 feature and >= 2 classes, got {n_features} and {n_classes}"
        )
    if cfg.kind == "softmax":
        return Softmax(n_features, n_classes, cfg.dtype, xp)
    if cfg.kind == "mlp":
        if any(h <= 0 for h in cfg.hidden):
            raise ConfigError(f"model.hidden = {cfg.hidden!r}: expected positive layer widths")
        return MLP([n_features, *cfg.hidden, n_classes], cfg.dtype, xp)
    if cfg.kind == "null":
        n = max(1, int(cfg.size_mib * 2**20) // numpy.dtype(cfg.dtype).itemsize)
        return NullModel(n, n_classes, cfg.dtype, xp)
    if cfg.kind == "cnn":
        return build_cnn(cfg, n_features, n_classes, xp)
    if cfg.kind == "torch":  # imported here: only a torch run pays for importing PyTorch
        from learners.torch_model import TorchModel

        return TorchModel(cfg.module, n_features, n_classes, cfg.dtype, xp)
    if cfg.kind == "python":
        from learners.plain import PlainModel

        return PlainModel(cfg.module, n_features, n_classes, cfg.dtype, xp)
    raise ConfigError(
        f"model.kind = {cfg.kind!r}: expected one of softmax, mlp, null, cnn, torch, python"
    )
