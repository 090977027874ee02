import numpy as np
import pytest

from learners.data import BatchSampler, load_dataset, write_hdf5_dataset
from learners.models import build_model
from pserver.errors import DataError
from pserver.plan.config import DataConfig, ModelConfig


def test_digits_shapes_types_and_stratified_split():
    ds = load_dataset(DataConfig(source="digits", test_fraction=0.25), seed=0)
    assert ds.X_train.shape == (1347, 64) and ds.X_test.shape == (450, 64)
    assert (ds.n_features, ds.n_classes) == (64, 10)
    for X, y in ((ds.X_train, ds.y_train), (ds.X_test, ds.y_test)):
        assert X.dtype == np.float32 and X.flags.c_contiguous and 0 <= X.min() <= X.max() <= 1
        assert y.dtype == np.int64 and y.ndim == 1 and len(y) == len(X)
    share_train = np.bincount(ds.y_train) / len(ds.y_train)
    share_test = np.bincount(ds.y_test) / len(ds.y_test)
    assert np.abs(share_train - share_test).max() < 0.01


def test_digits_split_is_deterministic_in_the_seed():
    a, b = (load_dataset(DataConfig(), seed=3) for _ in range(2))
    assert np.array_equal(a.X_train, b.X_train) and np.array_equal(a.y_test, b.y_test)
    c = load_dataset(DataConfig(), seed=4)
    assert not np.array_equal(a.y_train, c.y_train)


def test_synthetic_is_deterministic_and_learnable():
    cfg = DataConfig(source="synthetic", n_samples=600, n_features=10, n_classes=4)
    ds = load_dataset(cfg, seed=1)
    assert ds.X_train.shape == (450, 10) and (ds.n_features, ds.n_classes) == (10, 4)
    assert np.array_equal(ds.X_test, load_dataset(cfg, seed=1).X_test)
    m = build_model(ModelConfig(kind="softmax"), ds.n_features, ds.n_classes)
    w = m.init_params(0)
    grad = np.empty_like(w)
    for _ in range(100):
        m.loss_grad(w, ds.X_train, ds.y_train, grad)
        w -= 0.5 * grad
    assert m.evaluate(w, ds.X_test, ds.y_test)[1] < 0.4  # chance is 0.75


def test_sampler_streams_one_permutation_per_epoch():
    n, b = 10, 4
    s = BatchSampler(n, b, seed=0)
    batches = [s.next() for _ in range(15)]  # 60 samples: exactly 6 epochs
    assert all(x.dtype == np.int64 and x.shape == (b,) for x in batches)
    stream = np.concatenate(batches)
    epochs = stream.reshape(6, n)
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert not all(np.array_equal(epochs[0], e) for e in epochs[1:])  # fresh permutations
    assert np.array_equal(batches[2], np.concatenate([epochs[0][8:], epochs[1][:2]]))
    assert s.epoch == 6.0


def test_sampler_is_deterministic_and_counts_epochs():
    a, b, c = BatchSampler(7, 3, 5), BatchSampler(7, 3, 5), BatchSampler(7, 3, 6)
    sa = [a.next() for _ in range(10)]
    assert all(np.array_equal(x, b.next()) for x in sa)
    assert not all(np.array_equal(x, c.next()) for x in sa)
    assert a.epoch == pytest.approx(30 / 7)


def test_sampler_batch_larger_than_the_set_spans_epochs():
    s = BatchSampler(3, 7, seed=0)
    stream = np.concatenate([s.next() for _ in range(3)])
    assert all(sorted(e) == [0, 1, 2] for e in stream.reshape(7, 3))


def test_hdf5_roundtrip_flattens_and_splits(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2, 3))
    y = np.arange(40) % 4
    path = tmp_path / "d.h5"
    write_hdf5_dataset(path, X, y)
    ds = load_dataset(DataConfig(source="hdf5", path=str(path), batch_size=8), seed=0)
    assert ds.X_train.shape == (30, 6) and ds.X_test.shape == (10, 6)
    assert ds.X_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert (ds.n_features, ds.n_classes) == (6, 4)
    assert sorted(np.bincount(ds.y_test)) == [2, 2, 3, 3]  # stratified
    got = np.concatenate([ds.X_train, ds.X_test])
    want = X.reshape(40, 6).astype(np.float32)
    assert sorted(map(tuple, got)) == sorted(map(tuple, want))


def test_hdf5_separate_test_file_and_integral_float_labels(tmp_path):
    write_hdf5_dataset(tmp_path / "tr.h5", np.ones((8, 3)), np.array([0, 1] * 4))
    write_hdf5_dataset(tmp_path / "te.h5", np.zeros((5, 3)), np.array([0, 1, 2, 2, 0.0]))
    cfg = DataConfig(
        source="hdf5", path=str(tmp_path / "tr.h5"), test_path=str(tmp_path / "te.h5"), batch_size=8
    )
    ds = load_dataset(cfg, seed=0)
    assert ds.X_train.shape == (8, 3) and ds.X_test.shape == (5, 3)
    assert ds.n_classes == 3 and ds.y_test.dtype == np.int64


def write_text(path):
    path.write_text("this is not HDF5\n")


def missing_key(key):
    def make(path):
        import h5py

        with h5py.File(path, "w") as f:
            f["X" if key == "y" else "y"] = np.zeros(40)

    return make


def with_data(X, y):
    return lambda path: write_hdf5_dataset(path, X, y)


GOOD_X, GOOD_Y = np.ones((40, 3)), np.arange(40) % 2
NAN_X = GOOD_X.copy()
NAN_X[5, 1] = np.nan
INF_X = GOOD_X.copy()
INF_X[7, 0] = np.inf


@pytest.mark.parametrize(
    "writer, fragment",
    [
        (None, "does not exist"),
        (write_text, "not an HDF5 file"),
        (missing_key("X"), "no dataset 'X'"),
        (missing_key("y"), "no dataset 'y'"),
        (with_data(GOOD_X, GOOD_Y[:30]), "X has 40 samples but y has 30 labels"),
        (with_data(GOOD_X, GOOD_Y + 0.5), "integer class labels"),
        (with_data(GOOD_X, GOOD_Y - 1), "negative labels"),
        (with_data(NAN_X, GOOD_Y), r"1 NaN or infinite values \(first in sample 5\)"),
        (with_data(INF_X, GOOD_Y), r"1 NaN or infinite values \(first in sample 7\)"),
        (with_data(np.array(["a"] * 40, dtype="S1")[:, None], GOOD_Y), "expected numbers"),
        (with_data(GOOD_X[:, 0], GOOD_Y), r"X has shape \(40,\)"),
        (with_data(GOOD_X[:8], GOOD_Y[:8]), "6 samples, fewer than data.batch_size = 32"),
    ],
)
def test_bad_hdf5_raises_data_error_naming_file_and_problem(tmp_path, writer, fragment):
    path = tmp_path / "bad.h5"
    if writer is not None:
        writer(path)
    with pytest.raises(DataError, match=fragment) as info:
        load_dataset(DataConfig(source="hdf5", path=str(path)), seed=0)
    assert "bad.h5" in str(info.value)


def test_test_file_with_other_feature_count_raises(tmp_path):
    write_hdf5_dataset(tmp_path / "tr.h5", GOOD_X, GOOD_Y)
    write_hdf5_dataset(tmp_path / "te.h5", np.ones((10, 4)), GOOD_Y[:10])
    cfg = DataConfig(source="hdf5", path=str(tmp_path / "tr.h5"), test_path=str(tmp_path / "te.h5"))
    with pytest.raises(DataError, match="te.h5.*4 features.*tr.h5.* has 3"):
        load_dataset(cfg, seed=0)


def test_any_source_smaller_than_the_batch_raises():
    with pytest.raises(DataError, match="digits: the training set has 1347 samples"):
        load_dataset(DataConfig(source="digits", batch_size=5000), seed=0)
    with pytest.raises(DataError, match="synthetic"):
        load_dataset(DataConfig(source="synthetic", n_samples=40), seed=0)


def test_digits_file_is_scikit_learns_dataset():
    from sklearn.datasets import load_digits

    from learners.data import _digits_csv

    X, y = _digits_csv()
    raw = load_digits()
    assert np.array_equal(X, raw.data) and np.array_equal(y, raw.target)


@pytest.mark.parametrize("n, fraction", [(1797, 0.25), (40, 0.25), (101, 0.1), (13, 0.5)])
def test_split_sizes_partition_and_stratification(n, fraction):
    from learners.data import _split

    y = np.arange(n) % 4
    X = np.arange(n, dtype=np.float32)[:, None]
    X_tr, y_tr, X_te, y_te = _split("t", X, y, fraction, seed=0)
    assert len(y_te) == int(np.ceil(fraction * n)) and len(y_tr) + len(y_te) == n
    assert sorted(np.concatenate([X_tr[:, 0], X_te[:, 0]])) == list(range(n))  # a partition
    assert np.array_equal(y[X_te[:, 0].astype(int)], y_te)  # labels travel with their samples
    want = np.bincount(y) * len(y_te) / n
    assert np.all(np.abs(np.bincount(y_te, minlength=4) - want) < 1)  # each class its share


def test_split_without_two_of_each_class_is_plain_and_impossible_splits_say_so():
    from learners.data import _split

    y = np.array([0, 1, 1, 1, 1, 1, 1, 1])
    X = np.zeros((8, 2))
    _, y_tr, _, y_te = _split("t", X, y, 0.25, seed=0)
    assert len(y_te) == 2 and len(y_tr) == 6
    with pytest.raises(DataError, match="cannot split 8 samples with test_fraction = 0.99"):
        _split("t", X, y, 0.99, seed=0)


def hdf5_refused(path) -> str:
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(source="hdf5", path=str(path)), seed=0)
    return str(info.value)


@pytest.mark.parametrize(
    "labels, shown",
    [
        (np.full(20, 2**64 - 1, dtype=np.uint64), "18446744073709551615"),  # was cast to -1
        (np.full(20, 1e20), "1e+20"),  # passed, then crashed the first test
    ],
)
def test_huge_labels_are_refused_before_the_cast(tmp_path, labels, shown):
    labels[:10] = 0
    path = tmp_path / "d.h5"
    write_hdf5_dataset(path, np.ones((20, 3), np.float32), labels)
    msg = hdf5_refused(path)
    assert f"y has a label {shown}" in msg and "C <= 16,777,216" in msg


def test_links_and_virtual_datasets_are_not_followed(tmp_path):
    import h5py

    other = tmp_path / "other.h5"
    write_hdf5_dataset(other, np.ones((20, 3), np.float32), np.arange(20) % 2)
    linked = tmp_path / "linked.h5"
    with h5py.File(linked, "w") as f:
        f["X"] = h5py.ExternalLink(str(other), "/X")
        f.create_dataset("y", data=np.arange(20) % 2)
    assert "'X' is a ExternalLink" in hdf5_refused(linked)
    soft = tmp_path / "soft.h5"
    with h5py.File(soft, "w") as f:
        f["g"] = h5py.ExternalLink(str(other), "/")
        f["X"] = h5py.SoftLink("/g/X")
        f.create_dataset("y", data=np.arange(20) % 2)
    assert "'X' is a SoftLink" in hdf5_refused(soft)
    virtual = tmp_path / "virtual.h5"
    layout = h5py.VirtualLayout(shape=(20, 3), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(other), "X", shape=(20, 3))
    with h5py.File(virtual, "w") as f:
        f.create_virtual_dataset("X", layout)
        f.create_dataset("y", data=np.arange(20) % 2)
    assert "'X' is a virtual dataset" in hdf5_refused(virtual)


def test_declared_shape_is_known_without_reading(tmp_path):
    import h5py

    from learners.data import data_size

    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:  # chunked and never written: a few KiB on disk
        f.create_dataset("X", shape=(10**9, 10**4), dtype=np.float64, chunks=(1, 1000))
        f.create_dataset("y", shape=(10**9,), dtype=np.int64, chunks=(1000,))
    need, what = data_size(DataConfig(source="hdf5", path=str(path)))
    assert need >= 10**13 * 16 and "1000000000 x 10000 values of 8 bytes" in what


def test_data_path_that_is_a_directory(tmp_path):
    assert "is a directory, expected an HDF5 file" in hdf5_refused(tmp_path)


# -- only the data server (and the statistics server, for its test set) holds the data ----------


@pytest.mark.parametrize(
    "cfg",
    [
        DataConfig(),
        DataConfig(source="synthetic", n_samples=500, n_features=7, n_classes=3),
        DataConfig(source="synthetic", n_samples=500, test_fraction=0.3),
    ],
)
def test_the_described_shape_is_the_loaded_one(cfg):
    from learners.data import describe_dataset

    full, shape = load_dataset(cfg, seed=1), describe_dataset(cfg, seed=1)
    assert (shape.n_train, shape.n_features, shape.n_classes, shape.name) == (
        len(full.y_train), full.n_features, full.n_classes, full.name)  # fmt: skip
    assert shape.X_train.size == shape.X_test.size == 0  # nothing held


def test_hdf5_shape_comes_from_metadata_and_labels(tmp_path):
    from learners.data import describe_dataset

    write_hdf5_dataset(tmp_path / "tr.h5", np.ones((40, 2, 3)), np.arange(40) % 5)
    write_hdf5_dataset(tmp_path / "te.h5", np.zeros((9, 6)), np.array([0, 6] + [1] * 7))
    for test_path in ("", str(tmp_path / "te.h5")):
        cfg = DataConfig(source="hdf5", path=str(tmp_path / "tr.h5"), test_path=test_path,
                         batch_size=8)  # fmt: skip
        full, shape = load_dataset(cfg, 0), describe_dataset(cfg, 0)
        assert (shape.n_train, shape.n_features, shape.n_classes) == (
            len(full.y_train), full.n_features, full.n_classes)  # fmt: skip


@pytest.mark.parametrize(
    "writer, fragment",
    [
        (None, "does not exist"),
        (write_text, "not an HDF5 file"),
        (missing_key("X"), "no dataset 'X'"),
        (with_data(GOOD_X, GOOD_Y[:30]), "X has 40 samples but y has"),
        (with_data(GOOD_X, GOOD_Y + 0.5), "integer class labels"),
        (with_data(np.array(["a"] * 40, dtype="S1")[:, None], GOOD_Y), "expected numbers"),
        (with_data(GOOD_X[:, 0], GOOD_Y), r"X has shape \(40,\)"),
        (with_data(GOOD_X[:8], GOOD_Y[:8]), "6 samples, fewer than data.batch_size = 32"),
    ],
)
def test_described_hdf5_refuses_what_loading_refuses(tmp_path, writer, fragment):
    from learners.data import describe_dataset

    path = tmp_path / "bad.h5"
    if writer is not None:
        writer(path)
    with pytest.raises(DataError, match=fragment):
        describe_dataset(DataConfig(source="hdf5", path=str(path)), seed=0)


def test_stats_server_keeps_the_test_set_only():
    ds = load_dataset(DataConfig(), 0).test_only()
    assert ds.X_train.size == 0 and ds.n_train == 1347 and len(ds.y_test) == 450


@pytest.mark.parametrize("fraction", [0.25, 0.1, 0.5])
def test_digits_shape_without_reading_equals_the_loaded_split(fraction):
    """The learners' shape of the digits (from DIGITS, no read) is the data server's split."""
    from learners.data import DIGITS, describe_dataset

    cfg = DataConfig(source="digits", test_fraction=fraction)
    ds, shape = load_dataset(cfg, seed=0), describe_dataset(cfg, seed=0)
    assert (len(ds.y_train) + len(ds.y_test), ds.n_features, ds.n_classes) == DIGITS
    assert (shape.n_train, shape.n_features, shape.n_classes) == (
        ds.n_train, ds.n_features, ds.n_classes
    )
    assert shape.name == ds.name
