"""One start-up line saying what a run trains: the data (sizes, features, classes, the scaling
applied) and the model (kind, parameters, bytes). Logged by the statistics server's rank, the
one rank that reads the data and knows the scaling ``data.scale = "auto"`` chose from it
(:mod:`learners.scaling`); the same facts are in the dump (``data_scale``, ``model/``). Pure."""

from __future__ import annotations

from typing import Any

from pserver.plan.config import ModelConfig


def size_text(nbytes: int) -> str:
    """``512 B``, ``18.8 KiB``, ``3.2 MiB``, ``1.1 GiB``."""
    size, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"


def data_text(ds: Any) -> str:
    """``digits: 1347 train / 450 test samples, 64 features, 10 classes, scaling …``."""
    scaling = ds.scaling
    how = "not known on this rank" if scaling is None else (
        f"{scaling.applied} ({scaling.reason})" if scaling.reason else scaling.applied)
    return (
        f"{ds.name}: {ds.n_train} train / {len(ds.y_test)} test samples, {ds.n_features} "
        f"features, {ds.n_classes} classes, scaling {how}"
    )


def model_text(cfg: ModelConfig, model: Any) -> str:
    """``mlp, 4810 parameters in 4 tensors, float32, 18.8 KiB``."""
    kind = cfg.kind if cfg.kind not in ("torch", "python") else f"{cfg.kind} {cfg.module}"
    n, tensors = model.n_params, len(model.layer_sizes)
    return (
        f"{kind}, {n} parameters in {tensors} tensor{'s' * (tensors != 1)}, "
        f"{model.dtype.name}, {size_text(n * model.dtype.itemsize)}"
    )


def startup_line(ds: Any, cfg: ModelConfig, model: Any) -> str:
    """The line: ``data: …; model: …``."""
    return f"data: {data_text(ds)}; model: {model_text(cfg, model)}"
