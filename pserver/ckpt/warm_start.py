"""Warm starts: a run's initial weights from another run's final model (``model.init_from``).

Rudra §V-D trains its 1-softsync runs "by initializing the network's weights from a model
trained with hardsync for 1 epoch" (warmstarting); ``scripts/reproduce_rudra.py table4`` does
the same. ``model.init_from`` names a run directory (or its ``stats.h5``) whose dump holds the
final flat weight vector (``model/weights``, written when the run ends); every rank reads it
before training instead of drawing ``init_params(run.seed)``, so every rank starts from the
same w0, as it would from the seed.

This is not ``--resume``: optimizer state, timestamps, the data stream and the dump start
afresh, and the layout and protocol may differ from the source run's (the point of a warm
start is to compare protocols from one model). What must match is the model: its kind and
architecture keys in the source dump's config, and its parameter count. A dtype other than
``model.dtype`` is cast (float64 to float32 rounds). Every problem is one ``ConfigError``
line, raised in ``prepare`` on every rank (start-up agreement: exit 2 on every rank).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from pserver.ckpt.h5stored import OUTSIDE, stored
from pserver.dump.schema import MODEL_WEIGHTS
from pserver.errors import ConfigError

DUMP = "stats.h5"
#: the model keys that decide what the flat vector means (dtype may differ: it is cast)
ARCHITECTURE = ("kind", "hidden", "channels", "size_mib", "module")


def resolved(init_from: str) -> str:
    """The run ``init_from`` names, every link on the way followed (``runs/x/latest`` becomes
    the run it points at now), so that the config a run records names its source for good;
    a path that does not exist as it is (:func:`load_initial_weights` says why)."""
    p = Path(init_from)
    return os.path.realpath(p) if p.exists() else init_from


def dump_path(init_from: str) -> Path:
    """The dump a ``model.init_from`` value names: a run directory's ``stats.h5``, or a file."""
    p = Path(init_from)
    return p / DUMP if p.is_dir() else p


def architecture_mismatch(source: dict[str, Any], model: dict[str, Any]) -> list[str]:
    """The architecture keys whose values differ (``model.key = source's -> this run's``)."""
    out = []
    for key in ARCHITECTURE:
        if key in source and source[key] != model.get(key):
            out.append(f"model.{key} = {source[key]!r} there, {model.get(key)!r} here")
    return out


def load_initial_weights(
    init_from: str, model: dict[str, Any], n_params: int, dtype: Any
) -> np.ndarray:
    """The source run's final weights as this run's w0 (``n_params`` values of ``dtype``).

    ``model`` is this run's ``[model]`` section as a dict. Raises ConfigError naming the key
    and the file for a missing or unreadable dump, a dump without a final model, another
    architecture, another parameter count or non-finite values.
    """
    import h5py

    where = f"model.init_from = {init_from!r}"
    path = dump_path(init_from)
    if not path.is_file():
        raise ConfigError(f"{where}: {str(path)!r} does not exist (expected a run directory "
                          f"with a {DUMP}, or a dump file)")  # fmt: skip
    if not h5py.is_hdf5(path):
        raise ConfigError(f"{where}: {str(path)!r} is not an HDF5 dump")
    try:
        w = _read_weights(path, where, model, n_params)
    except ConfigError:
        raise
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, MemoryError) as e:
        # a truncated or bit-flipped file: HDF5 fails anywhere from the open to the read
        raise ConfigError(
            f"{where}: {str(path)!r} cannot be read (truncated or corrupt?): {e}"
        ) from None
    if not np.all(np.isfinite(w)):
        raise ConfigError(f"{where}: its final model has NaN or infinite values")
    return np.ascontiguousarray(w, dtype=dtype)


def _read_weights(path: Path, where: str, model: dict[str, Any], n_params: int) -> np.ndarray:
    """The final model of the dump at ``path``, its architecture, shape and dtype checked
    before anything is allocated."""
    import h5py

    with h5py.File(path, "r") as f:
        wrong = architecture_mismatch(_source_model(f, where), model)
        if wrong:
            raise ConfigError(f"{where}: another model: " + "; ".join(wrong))
        ds = _final_model(f, where, path)
        if ds.ndim != 1 or ds.shape[0] != n_params or ds.dtype.kind != "f":
            raise ConfigError(
                f"{where}: its final model is {ds.dtype}{list(ds.shape)}, this run's has "
                f"{n_params} parameters (another dataset, or other classes?)"
            )
        return np.asarray(ds[()])


def _final_model(f: Any, where: str, path: Path) -> Any:
    """``model/weights``, stored in the dump itself (``pserver.ckpt.h5stored``: no link or external
    storage followed)."""
    ds, problem, _ = stored(f, MODEL_WEIGHTS)
    if problem == OUTSIDE:
        raise ConfigError(f"{where}: {MODEL_WEIGHTS} keeps its data outside {str(path)!r}")
    if problem is not None:
        raise ConfigError(
            f"{where}: {str(path)!r} holds no final model ({MODEL_WEIGHTS}, which a run "
            "writes when it ends)"
        )
    return ds


def _source_model(f: Any, where: str) -> dict[str, Any]:
    """The ``[model]`` section of the config the source dump records."""
    try:
        cfg = json.loads(f.attrs["config"])
        return dict(cfg["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: the dump records no readable config ({e})") from None
