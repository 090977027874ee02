"""A harder classification task made on the spot: labels from a random teacher network.

The digits are too easy to separate the model-averaging strategies (every one ends near the same
error: docs/protocols.md, "Reproducing Tables 1–3").
Here ``n`` inputs x = z·A (z ~ N(0, I), A a random mixing: correlated features) are labelled by
a random two-layer tanh network (the *teacher*) whose logits get Gumbel noise, so that the
labels are a smooth but nonlinear function of x with a known share of noise: a student MLP of
the quickstart's size learns it slowly over many epochs, and how far a training strategy gets
in a fixed number of data passes shows. Pure numpy, seeded, no network: the reproduction
script (``scripts/reproduce_bmuf.py``) writes it to an HDF5 file for ``data.source = "hdf5"``.
"""

from __future__ import annotations

import numpy as np


def teacher_task(
    n: int = 20000,
    features: int = 32,
    classes: int = 10,
    hidden: int = 64,
    noise: float = 0.1,
    seed: int = 0,
    sharpness: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 [n, features], y int64 [n]) of the teacher task; ``noise`` is the Gumbel
    temperature on the teacher's standardized logits (0: a deterministic teacher),
    ``sharpness`` the scale of its first layer (larger: a more nonlinear teacher)."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(features, features)) / np.sqrt(features)
    x = rng.normal(size=(n, features)) @ mix
    w1 = rng.normal(size=(features, hidden)) * (sharpness / np.sqrt(features))
    w2 = rng.normal(size=(hidden, classes)) / np.sqrt(hidden)
    logits = np.tanh(x @ w1) @ w2
    logits = (logits - logits.mean(axis=0)) / logits.std()
    y = np.argmax(logits + noise * rng.gumbel(size=logits.shape), axis=1).astype(np.int64)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x.astype(np.float32), y
