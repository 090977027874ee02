"""Small Fashion-MNIST look-alikes: gzipped IDX files written the way Zalando and Debian ship
them, so tests need neither the Debian package nor 30 MB of reading."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

REAL_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


def idx_bytes(values: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 0x00 0x00 0x08 ndim, the dimensions, the values."""
    head = struct.pack(">HBB", 0, 0x08, values.ndim)
    return head + struct.pack(f">{values.ndim}I", *values.shape) + values.astype(np.uint8).tobytes()


def write_part(d: Path, part: str, X: np.ndarray, y: np.ndarray) -> None:
    for kind, values in (("images-idx3", X), ("labels-idx1", y)):
        with gzip.open(d / f"{part}-{kind}-ubyte.gz", "wb") as f:
            f.write(idx_bytes(values))


def fake_fashion(d: Path, n_train: int = 600, n_test: int = 200, side: int = 28) -> Path:
    """A learnable look-alike in ``d``: class c is a bright horizontal band at row 2c plus noise."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for part, n in (("train", n_train), ("t10k", n_test)):
        y = np.arange(n) % 10
        rng.shuffle(y)
        X = rng.integers(0, 60, size=(n, side, side))
        for i, c in enumerate(y):
            X[i, (2 * c) % side] = 250
        write_part(d, part, X, y)
    return d
