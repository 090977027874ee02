"""data.scale (learners/scaling.py): constants from the training set, applied to both sets, and
written into the dump; a uint8 HDF5 dataset trains (unscaled it diverged silently)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from mpirun import ROOT, train

from learners.data import _digits_csv, load_dataset, write_hdf5_dataset
from learners.scaling import LARGE, choose
from pserver.dump.schema import DATA_SCALING, ROOT_ATTRS
from pserver.errors import ConfigError
from pserver.plan.config import load_config


def rows(*values):
    return np.array(values, dtype=np.float32)


def test_auto_scales_integer_data_to_the_unit_interval_with_one_pair():
    X = rows([0, 10], [255, 3], [17, 128])
    s = choose("auto", X, integer=True)
    assert (s.applied, s.per_feature) == ("minmax", False)
    assert s.offset.tolist() == [0.0] and s.scale.tolist() == [255.0]
    s.apply(X)
    np.testing.assert_array_equal(X, rows([0, 10], [255, 3], [17, 128]) / np.float32(255))
    assert "integer" in s.reason


def test_auto_leaves_float_data_alone_and_warns_only_when_it_is_large():
    small = rows([0.5, -3.0], [1.0, 2.0])
    s = choose("auto", small, integer=False)
    assert s.applied == "none" and s.warning == ""
    before = small.copy()
    s.apply(small)
    np.testing.assert_array_equal(small, before)
    s = choose("auto", rows([0.0, 1.0], [2 * LARGE, 3.0]), integer=False)
    assert s.applied == "none"
    assert "data.scale" in s.warning and "\n" not in s.warning


def test_minmax_and_standard_are_per_feature_and_leave_constant_features_finite():
    X = rows([1, 5, 7], [3, 5, 9], [5, 5, 11])
    s = choose("minmax", X, integer=False)
    assert s.per_feature
    np.testing.assert_array_equal(s.offset, [1, 5, 7])
    np.testing.assert_array_equal(s.scale, [4, 1, 4])  # the constant column keeps scale 1
    Y = X.copy()
    s.apply(Y)
    np.testing.assert_allclose(Y, [[0, 0, 0], [0.5, 0, 0.5], [1, 0, 1]])
    s = choose("standard", X, integer=True)  # asked for outright: whatever the dtype
    np.testing.assert_allclose(s.offset, X.astype(np.float64).mean(axis=0))
    np.testing.assert_allclose(s.scale, np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0))
    s.apply(X)
    np.testing.assert_allclose(X.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(X.std(axis=0), [1, 0, 1], atol=1e-6)


def test_the_moments_are_accumulated_in_chunks(monkeypatch):
    import learners.scaling as scaling

    rng = np.random.default_rng(0)
    X = (rng.normal(size=(1000, 3)) * [1, 10, 100] + [5, -5, 1e4]).astype(np.float32)
    whole = choose("standard", X, integer=False)
    monkeypatch.setattr(scaling, "CHUNK", 7)
    chunked = choose("standard", X, integer=False)
    np.testing.assert_allclose(chunked.offset, whole.offset, rtol=1e-12)
    np.testing.assert_allclose(chunked.scale, whole.scale, rtol=1e-10)


def test_none_and_an_unknown_mode():
    s = choose("none", rows([1000.0]), integer=True)
    assert s.applied == "none" and s.warning == ""
    with pytest.raises(ValueError):
        choose("log", rows([1.0]), integer=False)
    with pytest.raises(ConfigError, match="data.scale"):
        load_config(None, ["data.scale=log"])


def uint8_digits(path):
    """The digits as uint8 images with values 0..255 (the issue's diverging dataset)."""
    X, y = _digits_csv()
    write_hdf5_dataset(path, np.minimum(X * 16, 255).astype(np.uint8), y)


def test_constants_come_from_the_training_set_and_apply_to_the_test_set(tmp_path):
    uint8_digits(tmp_path / "d.h5")
    cfg = load_config(None, ["data.source=hdf5", f"data.path={tmp_path / 'd.h5'}",
                             "data.scale=minmax"])
    ds = load_dataset(cfg.data, 0)
    assert ds.integer and ds.scaling.applied == "minmax" and ds.scaling.per_feature
    assert ds.X_train.min() == 0.0 and ds.X_train.max() == 1.0
    raw = load_dataset(load_config(None, ["data.source=hdf5", f"data.path={tmp_path / 'd.h5'}",
                                          "data.scale=none"]).data, 0)
    np.testing.assert_array_equal(ds.scaling.offset, raw.X_train.min(axis=0))
    want = (raw.X_test - ds.scaling.offset.astype(np.float32)) / ds.scaling.scale.astype(
        np.float32)
    np.testing.assert_array_equal(ds.X_test, want)


def test_digits_and_synthetic_data_are_unchanged_by_auto():
    for source in ("digits", "synthetic"):
        cfg = load_config(None, [f"data.source={source}"])
        ds = load_dataset(cfg.data, 0)
        assert ds.scaling.applied == "none" and ds.scaling.warning == ""


def test_the_dump_entries_are_documented():
    text = (ROOT / "docs" / "stats.md").read_text()
    assert ROOT_ATTRS["data_scale"] == "string (JSON)"
    for name in DATA_SCALING:
        assert f"`{name}`" in text


@pytest.mark.mpi
def test_a_uint8_hdf5_dataset_trains_and_the_dump_holds_its_scaling(tmp_path):
    uint8_digits(tmp_path / "d.h5")
    out = tmp_path / "run"
    train(out, 5, "data.source=hdf5", f"data.path={tmp_path / 'd.h5'}", "run.epochs=5",
          "optim.lr_milestones=[]")
    cfg = load_config(None, ["data.source=hdf5", f"data.path={tmp_path / 'd.h5'}"])
    ds = load_dataset(cfg.data, 0)
    with h5py.File(out / "stats.h5", "r") as f:
        described = json.loads(f.attrs["data_scale"])
        offset, scale = f["model/input_offset"][:], f["model/input_scale"][:]
        errors, losses = f["test/error"][:], f["train/loss"][:]
    assert described == json.loads(ds.scaling.describe())
    assert described["applied"] == "minmax" and not described["per_feature"]
    np.testing.assert_array_equal(offset, ds.scaling.offset)
    np.testing.assert_array_equal(scale, ds.scaling.scale)
    assert scale.tolist() == [255.0]
    # unscaled (data.scale = none, as before): loss 8.5e5 and 89.8 % error
    assert np.all(np.isfinite(losses)) and losses[-100:].mean() < 0.5
    assert errors[-1] < 0.1, errors
