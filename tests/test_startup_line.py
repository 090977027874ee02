"""The start-up line of the data and the model (learners.describe), from what the statistics
rank holds: the test set it loaded and the scaling it chose."""

from __future__ import annotations

import numpy as np
import pytest

from learners.data import load_dataset
from learners.describe import size_text, startup_line
from learners.models import build_model
from pserver.plan.config import load_config


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (19240, "18.8 KiB"),
                                     (3 * 2**20 + 2**19, "3.5 MiB"), (2**40 * 3, "3.0 TiB")])
def test_sizes(n, text):
    assert size_text(n) == text


@pytest.mark.parametrize("overrides, scaling", [
    (["data.scale=minmax"], "scaling minmax (data.scale = minmax)"),
    (["data.source=synthetic", "data.n_samples=500", "data.n_features=7", "data.n_classes=3"],
     "scaling none (auto: float features left as they are)"),
])
def test_the_line_says_what_the_statistics_rank_holds(overrides, scaling):
    cfg = load_config(None, ["model.kind=mlp", "model.hidden=[5]", *overrides])
    ds = load_dataset(cfg.data, cfg.run.seed, "test").test_only()  # as the stats rank holds it
    model = build_model(cfg.model, ds.n_features, ds.n_classes)
    line = startup_line(ds, cfg.model, model)
    f, c = ds.n_features, ds.n_classes
    n = f * 5 + 5 + 5 * c + c
    assert model.n_params == n
    assert line.startswith(f"data: {ds.name}: {ds.n_train} train / {len(ds.y_test)} test "
                           f"samples, {f} features, {c} classes, {scaling}; ")
    assert line.endswith(f"model: mlp, {n} parameters in 4 tensors, float32, "
                         f"{size_text(4 * n)}")
    assert ds.n_train > 0 and len(ds.y_test) > 0 and not np.isnan(ds.X_test).any()
