"""data.source = "fashion-mnist": the IDX reader's checks, the parts each role keeps, the
training subset and the validation split (one process; the real files only where installed)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from fake_fashion import REAL_DIR, fake_fashion, idx_bytes, write_part

from learners.data import data_size, describe_dataset, load_dataset
from pserver.errors import ConfigError, DataError
from pserver.plan.config import DataConfig
from pserver.plan.unused import unused


def cfg_for(d, **kw) -> DataConfig:
    return DataConfig(source="fashion-mnist", dir=str(d), **kw)


def test_reads_both_sets_scaled_to_unit_range(tmp_path):
    ds = load_dataset(cfg_for(fake_fashion(tmp_path)), seed=0)
    assert ds.X_train.shape == (600, 784) and ds.X_test.shape == (200, 784)
    assert ds.X_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.X_train.max() == pytest.approx(250 / 250) and ds.X_train.min() == 0.0
    assert (ds.n_features, ds.n_classes) == (784, 10)
    assert "[0, 250]" in ds.scaling.reason  # auto: the global min-max of the training bytes


def test_each_role_keeps_its_part_with_the_same_scaling(tmp_path):
    cfg = cfg_for(fake_fashion(tmp_path), scale="standard")
    every, train, test = (load_dataset(cfg, 0, part) for part in ("all", "train", "test"))
    assert len(train.X_test) == 0 and np.array_equal(train.X_train, every.X_train)
    assert len(test.X_train) == 0 and test.n_train == 600
    assert np.array_equal(test.X_test, every.X_test)  # constants from the training set


def test_subset_and_validation_split_agree_with_the_shape(tmp_path):
    cfg = cfg_for(fake_fashion(tmp_path), train_samples=300, validation=0.2)
    ds, shape = load_dataset(cfg, 1), describe_dataset(cfg, 1)
    assert (ds.n_train, len(ds.y_test)) == (240, 60) and shape.n_train == 240
    per_class = np.bincount(np.concatenate([ds.y_train, ds.y_test]), minlength=10)
    assert per_class.sum() == 300  # the first 300: their classes are not balanced
    assert np.abs(np.bincount(ds.y_test, minlength=10) - 0.2 * per_class).max() < 1  # stratified
    train = load_dataset(cfg, 1, "train")  # the data server holds out the same samples
    assert np.array_equal(train.X_train, ds.X_train)


def test_subset_larger_than_the_set_and_bad_keys_are_refused(tmp_path):
    d = fake_fashion(tmp_path)
    with pytest.raises(DataError, match="only 600 training samples"):
        describe_dataset(cfg_for(d, train_samples=601), 0)
    with pytest.raises(ConfigError, match="data.validation = 1.0"):
        load_dataset(cfg_for(d, validation=1.0), 0)
    with pytest.raises(ConfigError, match="data.train_samples = -1"):
        describe_dataset(cfg_for(d, train_samples=-1), 0)


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("missing", "does not exist: install Debian's package"),
        ("not-gzip", "not a readable gzip file"),
        ("magic", "magic number 0x00000903"),
        ("truncated", "not a readable gzip file"),
        ("short", "the header says 600 x 28 x 28 = 470,400 values but the file holds 470,399"),
        ("labels", "has 599 labels but its images file has 600"),
        ("label-value", "has a label 10, expected 0..9"),
    ],
)
def test_malformed_files_are_one_clear_error(tmp_path, damage, expected):
    d = fake_fashion(tmp_path)
    images, labels = d / "train-images-idx3-ubyte.gz", d / "train-labels-idx1-ubyte.gz"
    raw = gzip.decompress(images.read_bytes())
    if damage == "missing":
        images.unlink()
    elif damage == "not-gzip":
        images.write_bytes(raw)
    elif damage == "magic":
        images.write_bytes(gzip.compress(b"\0\0\x09\x03" + raw[4:]))
    elif damage == "truncated":
        images.write_bytes(images.read_bytes()[:1000])
    elif damage == "short":
        images.write_bytes(gzip.compress(raw[:-1]))
    elif damage == "labels":
        labels.write_bytes(gzip.compress(idx_bytes(np.zeros(599))))
    elif damage == "label-value":
        labels.write_bytes(gzip.compress(idx_bytes(np.full(600, 10))))
    with pytest.raises(DataError, match="fashion-mnist file .*train-") as e:
        load_dataset(cfg_for(d), 0)
    assert expected in str(e.value)


def test_learners_see_the_shape_from_headers_and_labels(tmp_path):
    d = fake_fashion(tmp_path)
    shape = describe_dataset(cfg_for(d), 0)
    assert (shape.n_train, shape.n_features, len(shape.X_train)) == (600, 784, 0)
    write_part(d, "t10k", np.zeros((5, 27, 27)), np.zeros(5))
    with pytest.raises(DataError, match="28 x 28 but the test images 27 x 27"):
        describe_dataset(cfg_for(d), 0)
    assert data_size(cfg_for(fake_fashion(tmp_path / "b")))[0] > 800 * 784


def test_data_dir_belongs_to_fashion_mnist():
    cfg = DataConfig(dir="/x")
    from pserver.plan.config import Config

    typed = frozenset({"data.dir"})
    refused, _ = unused(Config(data=cfg, given=typed, overridden=typed))  # on the command line
    assert any("data.dir" in line and "fashion-mnist" in line for line in refused)
    refused, unread = unused(Config(data=cfg, given=typed))  # in the file: listed, not refused
    assert not refused and any("data.dir" in entry for entry in unread)


@pytest.mark.skipif(not REAL_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_the_installed_dataset_has_the_official_sizes():
    shape = describe_dataset(DataConfig(source="fashion-mnist"), 0)
    assert (shape.n_train, shape.n_features, shape.n_classes) == (60_000, 784, 10)
    ds = load_dataset(DataConfig(source="fashion-mnist", train_samples=1000), 0, "test")
    assert ds.X_test.shape == (10_000, 784) and np.bincount(ds.y_test).tolist() == [1000] * 10
