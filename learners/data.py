"""Datasets (built-in digits, synthetic Gaussian classes, HDF5 files, Fashion-MNIST) and
minibatch sampling.

Everything here is host numpy: ``X`` float32, 2-D, C-contiguous; ``y`` int64, 1-D. Bad files
raise :class:`DataError` with one message that names the file and the problem. Every source
then goes through the same steps: ``data.train_samples`` keeps the first N training samples,
``data.validation`` holds a share of them out as the test set (for choosing hyper-parameters
without looking at the test set), and ``data.scale`` takes its constants from what is left.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from learners import fashion
from learners.scaling import Scaling, choose
from pserver.ckpt.h5stored import GROUP, LINK, MISSING, OUTSIDE, stored
from pserver.errors import ConfigError, DataError
from pserver.plan.config import DataConfig
from pserver.plan.limits import MAX_CLASSES, data_bytes

#: UCI's handwritten digits as scikit-learn ships them: samples, features (8x8), classes
DIGITS = (1797, 64, 10)

if TYPE_CHECKING:  # imported where a file is opened: most ranks never open one at start-up
    import h5py  # (docs/performance.md, *What a rank imports, by role*)


@dataclass
class Dataset:
    """A train/test split held in host memory, or only its shape (empty arrays): see
    :func:`describe_dataset` and :meth:`test_only`."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_features: int
    n_classes: int
    integer: bool = False  # the features were stored as integers (an HDF5 X of uint8, ...)
    scaling: Scaling | None = None  # what load_dataset applied (learners/scaling.py)
    n_train: int = -1  # training samples, also when X_train is not held (-1: len(y_train))

    def __post_init__(self) -> None:
        if self.n_train < 0:
            self.n_train = len(self.y_train)

    def test_only(self) -> Dataset:
        """The same dataset without its training arrays (what the statistics server needs)."""
        f = self.n_features
        empty_X, empty_y = np.empty((0, f), np.float32), np.empty(0, np.int64)
        return replace(self, X_train=empty_X, y_train=empty_y, n_train=self.n_train)


PARTS = ("all", "train", "test")


def load_dataset(cfg: DataConfig, seed: int, part: str = "all") -> Dataset:
    """Load the dataset named by ``cfg.source``; splits and synthetic data follow ``seed``.

    ``part`` says what the caller keeps: "train" (the data server; a source with its own test
    files leaves them unread), "test" (the statistics server: the training arrays are dropped
    once the scaling's constants are taken from them) or "all".
    """
    if part not in PARTS:
        raise ValueError(f"part = {part!r}: expected one of {', '.join(PARTS)}")
    _check_keys(cfg)
    loaders = {"digits": _digits, "synthetic": _synthetic, "hdf5": _hdf5,
               "fashion-mnist": partial(_fashion, part=part)}
    ds = _pick(loaders, cfg)(cfg, seed)
    return _checked(cfg, _held_out(cfg, _subset(cfg, ds), seed), part)


def describe_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """The dataset's shape (sizes, features, classes) with empty arrays, for the ranks that
    never read a sample: from the config (synthetic), or from the file's metadata and its labels
    (hdf5: X's shape and dtype, y read and checked: N labels, small beside X; fashion-mnist:
    the IDX headers and the labels files). The same errors as :func:`load_dataset`, except for
    the values of X (NaN, infinity; a truncated images file), which only the data server
    reads, and reports before training like any bad input."""
    _check_keys(cfg)
    shapes = {"digits": _digits_shape, "synthetic": _synthetic_shape, "hdf5": _hdf5_shape,
              "fashion-mnist": _fashion_shape}
    return _checked(cfg, _resized(cfg, _pick(shapes, cfg)(cfg, seed)))


def _pick(table: dict[str, Any], cfg: DataConfig) -> Any:
    if cfg.source not in table:
        raise ConfigError(f"data.source = {cfg.source!r}: expected one of {', '.join(table)}")
    return table[cfg.source]


def _check_keys(cfg: DataConfig) -> None:
    if cfg.train_samples < 0:
        raise ConfigError(
            f"data.train_samples = {cfg.train_samples}: expected 0 (all) or a sample count"
        )
    if not 0.0 <= cfg.validation < 1.0:
        raise ConfigError(
            f"data.validation = {cfg.validation!r}: expected a share of the training set in "
            "[0, 1) (0: test on the test set)"
        )


def _checked(cfg: DataConfig, ds: Dataset, part: str = "all") -> Dataset:
    n = ds.n_train
    if n < cfg.batch_size:
        raise DataError(
            f"{ds.name}: the training set has {n} samples, fewer than "
            f"data.batch_size = {cfg.batch_size}"
        )
    if len(ds.X_train) == 0:  # only its shape (describe_dataset): nothing to scale
        return ds
    return scale(ds, cfg.scale, part)


def scale(ds: Dataset, mode: str, part: str = "all") -> Dataset:
    """``ds`` with ``data.scale = mode`` applied: constants from the training set, applied to
    the training and the test set (``learners.scaling``). Integer arrays (Fashion-MNIST's
    bytes) become float32 here; with ``part = "test"`` the training arrays are dropped first."""
    ds.scaling = choose(mode, ds.X_train, ds.integer)
    if part == "test":
        ds = ds.test_only()
    ds.X_train, ds.X_test = (np.ascontiguousarray(a, np.float32) for a in (ds.X_train, ds.X_test))
    ds.scaling.apply(ds.X_train)
    ds.scaling.apply(ds.X_test)
    return ds


def _subset(cfg: DataConfig, ds: Dataset) -> Dataset:
    """``data.train_samples``: the first N training samples (copied, so the rest is freed)."""
    n = _subset_size(cfg, ds)
    if n == ds.n_train:
        return ds
    return replace(ds, X_train=ds.X_train[:n].copy(), y_train=ds.y_train[:n].copy(), n_train=n)


def _subset_size(cfg: DataConfig, ds: Dataset) -> int:
    n = cfg.train_samples or ds.n_train
    if n > ds.n_train:
        raise DataError(
            f"data.train_samples = {n}: {ds.name} has only {ds.n_train} training samples"
        )
    return n


def _held_out(cfg: DataConfig, ds: Dataset, seed: int) -> Dataset:
    """``data.validation``: a stratified share of the training set becomes the test set."""
    if cfg.validation == 0:
        return ds
    name = f"{ds.name} (data.validation = {cfg.validation})"
    X, y, X_val, y_val = _split(name, ds.X_train, ds.y_train, cfg.validation, seed)
    return replace(ds, X_train=X, y_train=y, X_test=X_val, y_test=y_val, n_train=len(y))


def _resized(cfg: DataConfig, ds: Dataset) -> Dataset:
    """:func:`_subset` and :func:`_held_out` on a shape-only dataset: the same sizes."""
    n_train = _subset_size(cfg, ds)
    if cfg.validation > 0:
        name = f"{ds.name} (data.validation = {cfg.validation})"
        n_train, n_test = _split_sizes(name, n_train, cfg.validation)
        return _shape_only(ds.name, n_train, n_test, ds.n_features, ds.n_classes)
    return replace(ds, n_train=n_train)


def data_size(cfg: DataConfig) -> tuple[int, str]:
    """Peak bytes one rank holds while loading the dataset (``pserver.plan.limits.data_bytes``),
    known before it is loaded, and what sets them (keys or file) for an error message."""
    if cfg.source == "synthetic":
        n, f, c = cfg.n_samples, cfg.n_features, cfg.n_classes
        # rng.normal's float64 noise and the float64 centroids[y]: two 8-byte values per entry
        return data_bytes(n, f, 16, c), f"data.n_samples = {n}, data.n_features = {f}"
    if cfg.source == "hdf5":
        total, files = 0, []
        for path in (cfg.path, cfg.test_path):
            if path:
                n, f, raw = hdf5_shape(path)
                total += data_bytes(n, f, raw)
                files.append(f"{path!r} (X: {n} x {f} values of {raw} bytes)")
        return total, f"data file {' and '.join(files)}"
    if cfg.source == "fashion-mnist":
        n_train, n_test, f = fashion.image_shape(cfg.dir)
        where = str(fashion.files(cfg.dir, "train")[0].parent)
        return data_bytes(n_train + n_test, f, 1), f"fashion-mnist in {where!r}"
    return data_bytes(DIGITS[0], DIGITS[1], 8), "data.source = digits"


def _digits(cfg: DataConfig, seed: int) -> Dataset:
    """UCI's 8x8 handwritten digits (1,797 samples), the copy that ships with scikit-learn.

    Read straight from scikit-learn's CSV: importing ``sklearn.datasets`` takes about a second
    per process (most of it SciPy building docstrings), on every rank of a job, where reading
    the file takes milliseconds (docs/performance.md, "Loading the digits").
    """
    X, y = _digits_csv()
    X = (X / 16.0).astype(np.float32)
    return _dataset("digits", *_split("digits", X, y, cfg.test_fraction, seed), n_classes=10)


def _digits_csv() -> tuple[np.ndarray, np.ndarray]:
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if path is None or not path.is_file():  # another layout: ask scikit-learn itself
        from sklearn.datasets import load_digits

        raw = load_digits()
        return raw.data, raw.target.astype(np.int64)
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int64)


def _synthetic(cfg: DataConfig, seed: int) -> Dataset:
    """Gaussian blobs: centroids ~ N(0, 9/F) per coordinate, unit noise; learnable, not trivial."""
    rng = np.random.default_rng(seed)
    n, f, c = cfg.n_samples, cfg.n_features, cfg.n_classes
    centroids = rng.normal(0.0, 3.0 / math.sqrt(f), size=(c, f))
    y = rng.permutation(np.arange(n, dtype=np.int64) % c)
    X = (centroids[y] + rng.normal(size=(n, f))).astype(np.float32)
    parts = _split("synthetic", X, y, cfg.test_fraction, seed)
    return _dataset("synthetic", *parts, n_classes=c)


def _hdf5(cfg: DataConfig, seed: int) -> Dataset:
    X, y = read_hdf5(cfg.path)
    integer = stored_integer(cfg.path)
    if not cfg.test_path:
        parts = _split(cfg.path, X, y, cfg.test_fraction, seed)
        ds = _dataset(cfg.path, *parts)
        ds.integer = integer
        return ds
    X_test, y_test = read_hdf5(cfg.test_path)
    if X_test.shape[1] != X.shape[1]:
        raise DataError(
            f"test file {cfg.test_path!r} has {X_test.shape[1]} features per sample but "
            f"training file {cfg.path!r} has {X.shape[1]}"
        )
    ds = _dataset(cfg.path, X, y, X_test, y_test)
    ds.integer = integer
    return ds


def _fashion(cfg: DataConfig, seed: int, part: str = "all") -> Dataset:
    """Fashion-MNIST's official sets (60,000 training and 10,000 test images of 28 x 28 bytes,
    ``learners.fashion``), kept as bytes until :func:`scale`. The data server (``part =
    "train"``) leaves the test files unread, and so does a run tested on ``data.validation``."""
    X, y = fashion.load_part(cfg.dir, "train")
    if part == "train" or cfg.validation > 0:
        X_test, y_test = np.empty((0, X.shape[1]), np.uint8), np.empty(0, np.uint8)
    else:
        X_test, y_test = fashion.load_part(cfg.dir, "t10k")
        if X_test.shape[1] != X.shape[1]:
            raise DataError(
                f"fashion-mnist: the training images have {X.shape[1]} pixels but the test "
                f"images {X_test.shape[1]}"
            )
    y, y_test = y.astype(np.int64), y_test.astype(np.int64)
    where = str(fashion.files(cfg.dir, "train")[0].parent)
    return Dataset(f"fashion-mnist ({where})", X, y, X_test, y_test, X.shape[1],
                   fashion.N_CLASSES, integer=True)


def _fashion_shape(cfg: DataConfig, seed: int) -> Dataset:
    """The IDX headers and both labels files (70,000 bytes): sizes checked, pixels unread."""
    n_train, n_test, f = fashion.image_shape(cfg.dir)
    for part, n in (("train", n_train), ("t10k", n_test)):
        fashion.labels(fashion.files(cfg.dir, part)[1], n)
    where = str(fashion.files(cfg.dir, "train")[0].parent)
    return _shape_only(f"fashion-mnist ({where})", n_train, n_test, f, fashion.N_CLASSES)


def stored_integer(path: str | Path) -> bool:
    """Whether ``X`` in ``path`` (already validated by :func:`read_hdf5`) holds integers."""
    import h5py

    with h5py.File(path, "r") as f:
        return f["X"].dtype.kind in "iub"


def _digits_shape(cfg: DataConfig, seed: int) -> Dataset:
    """The digits' shape without reading them: the file is scikit-learn's fixed copy of UCI's
    set (``DIGITS``, checked against the file by tests/test_data.py); reading and splitting it
    on every learner was a cost of every job's start-up (docs/performance.md, *What a rank
    imports, by role*)."""
    n, f, c = DIGITS
    n_train, n_test = _split_sizes("digits", n, cfg.test_fraction)
    return _shape_only("digits", n_train, n_test, f, c)


def _synthetic_shape(cfg: DataConfig, seed: int) -> Dataset:
    n_train, n_test = _split_sizes("synthetic", cfg.n_samples, cfg.test_fraction)
    return _shape_only("synthetic", n_train, n_test, cfg.n_features, cfg.n_classes)


def _hdf5_shape(cfg: DataConfig, seed: int) -> Dataset:
    n, f = _hdf5_meta(cfg.path)
    y = _hdf5_labels(cfg.path, n)
    if not cfg.test_path:
        n_train, n_test = _split_sizes(cfg.path, n, cfg.test_fraction)
        return _shape_only(cfg.path, n_train, n_test, f, int(y.max()) + 1)
    n_test, f_test = _hdf5_meta(cfg.test_path)
    y_test = _hdf5_labels(cfg.test_path, n_test)
    if f_test != f:
        raise DataError(
            f"test file {cfg.test_path!r} has {f_test} features per sample but "
            f"training file {cfg.path!r} has {f}"
        )
    return _shape_only(cfg.path, n, n_test, f, int(max(y.max(), y_test.max())) + 1)


def _hdf5_meta(path: str) -> tuple[int, int]:
    """(N, F) of X from the metadata, with X's dtype checked as the data server checks it."""
    import h5py

    n, f, _ = hdf5_shape(path)
    p = Path(path)
    with h5py.File(p, "r") as fh:
        dtype = _stored_dataset(p, fh, "X").dtype
    if dtype.kind not in "biuf":
        raise DataError(f"data file {str(p)!r}: X has dtype {dtype}, expected numbers")
    return n, f


def _hdf5_labels(path: str, n: int) -> np.ndarray:
    import h5py

    p = Path(path)
    try:
        with h5py.File(p, "r") as fh:
            y = np.asarray(_stored_dataset(p, fh, "y")[()])
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise DataError(f"data file {str(p)!r} cannot be read: {e}") from None
    return _check_y(p, y, n)


def _split_sizes(name: str, n: int, fraction: float) -> tuple[int, int]:
    """(training, test) sample counts of :func:`_split` without splitting."""
    n_test = math.ceil(fraction * n)
    if not 0 < n_test < n:
        raise DataError(
            f"{name}: cannot split {n} samples with test_fraction = {fraction}: "
            f"that leaves {n_test} test and {n - n_test} training samples"
        )
    return n - n_test, n_test


def _shape_only(name: str, n_train: int, n_test: int, f: int, n_classes: int) -> Dataset:
    empty_X, empty_y = np.empty((0, f), np.float32), np.empty(0, np.int64)
    return Dataset(name, empty_X, empty_y, empty_X, empty_y, f, n_classes, n_train=n_train)


def read_hdf5(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate datasets ``X`` (N x ..., numeric) and ``y`` (N labels in 0..C-1)."""
    import h5py

    p = _hdf5_file(path)
    try:
        with h5py.File(p, "r") as f:
            X, y = (np.asarray(_stored_dataset(p, f, key)[()]) for key in ("X", "y"))
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise DataError(f"data file {str(p)!r} cannot be read: {e}") from None
    return _check_X(p, X), _check_y(p, y, len(X))


def hdf5_shape(path: str | Path) -> tuple[int, int, int]:
    """(N, F, bytes per stored value) of ``X`` in ``path``, from its metadata alone: what
    reading the file will allocate is known before anything is read."""
    import h5py

    p = _hdf5_file(path)
    try:
        with h5py.File(p, "r") as f:
            X, y = (_stored_dataset(p, f, key) for key in ("X", "y"))
            shape, itemsize, labels = X.shape, X.dtype.itemsize, y.shape
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise DataError(f"data file {str(p)!r} cannot be read: {e}") from None
    if len(shape) < 2 or shape[0] == 0 or math.prod(shape[1:]) == 0:  # an empty X too
        raise DataError(f"data file {str(p)!r}: X has shape {shape}, expected N x F with N, F >= 1")
    if not labels or labels[0] != shape[0] or math.prod(labels) != shape[0]:
        # one label per sample, checked before y is read: y of N x 2**30 would be allocated
        raise DataError(
            f"data file {str(p)!r}: X has {shape[0]} samples but y has shape {labels} "
            "(length mismatch)"
        )
    return int(shape[0]), math.prod(int(d) for d in shape[1:]), int(itemsize)


def _hdf5_file(path: str | Path) -> Path:
    import h5py

    p = Path(path)
    if p.is_dir():
        raise DataError(f"data file {str(p)!r} is a directory, expected an HDF5 file")
    if not p.is_file():
        raise DataError(f"data file {str(p)!r} does not exist or is not a file")
    if not h5py.is_hdf5(p):
        raise DataError(f"data file {str(p)!r} is not an HDF5 file")
    return p


def _stored_dataset(p: Path, f: h5py.File, key: str) -> h5py.Dataset:
    """Dataset ``key`` stored in ``f`` itself (``pserver.ckpt.h5stored``: no link, virtual dataset
    or external storage followed)."""
    obj, problem, detail = stored(f, key)
    if problem == MISSING:
        found = ", ".join(sorted(f.keys())) or "nothing"
        raise DataError(f"data file {str(p)!r} has no dataset {key!r} (found: {found})")
    if problem == LINK:
        raise DataError(
            f"data file {str(p)!r}: {key!r} is a {detail}; pserver reads only "
            "datasets stored in the file itself (no external or soft links)"
        )
    if problem == GROUP:
        raise DataError(f"data file {str(p)!r}: {key!r} is a group, expected a dataset")
    if problem == OUTSIDE:
        raise DataError(
            f"data file {str(p)!r}: {key!r} is a virtual dataset or keeps its data in external "
            "files; pserver reads only datasets stored in the file itself"
        )
    return obj


def _check_X(p: Path, X: np.ndarray) -> np.ndarray:
    if X.dtype.kind not in "biuf":
        raise DataError(f"data file {str(p)!r}: X has dtype {X.dtype}, expected numbers")
    if X.ndim < 2 or X.shape[0] == 0 or math.prod(X.shape[1:]) == 0:
        raise DataError(
            f"data file {str(p)!r}: X has shape {X.shape}, expected N x F with N, F >= 1"
        )
    X = np.ascontiguousarray(X.reshape(len(X), -1), dtype=np.float32)
    bad = ~np.isfinite(X)
    if bad.any():
        row = int(np.argmax(bad.any(axis=1)))
        raise DataError(
            f"data file {str(p)!r}: X has {int(bad.sum())} NaN or infinite values "
            f"(first in sample {row}), or values beyond float32's range"
        )
    return X


def _check_y(p: Path, y: np.ndarray, n: int) -> np.ndarray:
    """Labels must be integers (any integer dtype, or floats with integer values) in
    0..MAX_CLASSES-1; checked before the cast to int64, where 2**64-1 would become -1."""
    name = f"data file {str(p)!r}"
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{name}: y has shape {y.shape}, expected one label per sample")
    if len(y) != n:
        raise DataError(f"{name}: X has {n} samples but y has {len(y)} labels (length mismatch)")
    integral = y.dtype.kind in "iu" or (
        y.dtype.kind == "f" and bool(np.all(np.isfinite(y))) and bool(np.all(y == np.round(y)))
    )
    if not integral:
        raise DataError(f"{name}: y must hold integer class labels 0..C-1 (dtype {y.dtype})")
    if y.min() < 0:
        raise DataError(f"{name}: y has negative labels (min {y.min()}), expected 0..C-1")
    if y.max() >= MAX_CLASSES:
        raise DataError(
            f"{name}: y has a label {y.max()}, expected class labels 0..C-1 with "
            f"C <= {MAX_CLASSES:,} (the model has one output per class)"
        )
    return y.astype(np.int64)


def _split(
    name: str, X: np.ndarray, y: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, ...]:
    """Train/test split: ``ceil(fraction * N)`` test samples, drawn with ``seed``.

    Stratified (each class keeps its share in both parts, the classes' rounding remainders
    going to the largest fractional parts) when every class has at least two samples and both
    parts can hold one of each class; a plain random split otherwise.
    """
    n = len(y)
    n_test = len(y) - _split_sizes(name, n, fraction)[0]
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    if counts.min() < 2 or min(n_test, n - n_test) < len(classes):
        order = rng.permutation(n)
        test, train = order[:n_test], order[n_test:]
    else:
        share = counts * (n_test / n)
        take = np.floor(share).astype(np.int64)
        # remainders: largest fractional parts first, ties in random order
        rest = np.lexsort((rng.random(len(classes)), -(share - take)))
        take[rest[: n_test - int(take.sum())]] += 1
        test_parts, train_parts = [], []
        for c, k in zip(classes, take, strict=True):
            members = rng.permutation(np.flatnonzero(y == c))
            test_parts.append(members[:k])
            train_parts.append(members[k:])
        test = rng.permutation(np.concatenate(test_parts))
        train = rng.permutation(np.concatenate(train_parts))
    return X[train], y[train], X[test], y[test]


def _dataset(
    name: str,
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    y_test: np.ndarray,
    n_classes: int | None = None,
) -> Dataset:
    if n_classes is None:
        n_classes = int(max(y_train.max(), y_test.max())) + 1
    X_train, X_test = (np.ascontiguousarray(a, dtype=np.float32) for a in (X_train, X_test))
    y_train, y_test = (np.ascontiguousarray(a, dtype=np.int64) for a in (y_train, y_test))
    return Dataset(name, X_train, y_train, X_test, y_test, X_train.shape[1], n_classes)


class BatchSampler:
    """Endless stream of minibatch indices: one fresh permutation of ``range(n)`` per epoch.

    The stream is the concatenation of the permutations, cut into batches of exactly
    ``batch_size``; a batch at an epoch boundary takes the rest of one permutation and the start
    of the next.
    """

    def __init__(self, n: int, batch_size: int, seed: int):
        if n < 1 or batch_size < 1:
            raise ValueError(f"need n >= 1 and batch_size >= 1, got n={n}, batch={batch_size}")
        self.n, self.batch_size = n, batch_size
        self._rng = np.random.default_rng(seed)
        self._perm = np.empty(0, dtype=np.int64)
        self._pos = 0
        self._served = 0

    def next(self) -> np.ndarray:
        """The next ``batch_size`` int64 indices."""
        out = np.empty(self.batch_size, dtype=np.int64)
        filled = 0
        while filled < self.batch_size:
            if self._pos == len(self._perm):
                self._perm, self._pos = self._rng.permutation(self.n).astype(np.int64), 0
            take = min(self.batch_size - filled, self.n - self._pos)
            out[filled : filled + take] = self._perm[self._pos : self._pos + take]
            filled += take
            self._pos += take
        self._served += self.batch_size
        return out

    @property
    def epoch(self) -> float:
        """Samples handed out so far divided by ``n``."""
        return self._served / self.n

    def state(self) -> tuple[dict[str, Any], np.ndarray]:
        """Everything :meth:`restore` needs to continue the stream exactly: JSON-able
        attributes and the current permutation."""
        attrs = {"rng": self._rng.bit_generator.state, "pos": self._pos, "served": self._served,
                 "n": self.n, "batch_size": self.batch_size}
        return attrs, self._perm.copy()

    def restore(self, attrs: dict[str, Any], perm: np.ndarray) -> None:
        """Continue from a :meth:`state` of a sampler over the same ``n`` and batch size."""
        if (attrs["n"], attrs["batch_size"]) != (self.n, self.batch_size):
            raise ValueError(
                f"sampler state of n={attrs['n']}, batch={attrs['batch_size']} does not fit "
                f"n={self.n}, batch={self.batch_size}"
            )
        self._rng.bit_generator.state = attrs["rng"]
        self._perm = np.asarray(perm, dtype=np.int64).copy()
        self._pos, self._served = int(attrs["pos"]), int(attrs["served"])


def write_hdf5_dataset(path: str | Path, X: Any, y: Any) -> None:
    """Write ``X`` and ``y`` as datasets ``"X"`` and ``"y"`` of a new HDF5 file at ``path``."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.asarray(X))
        f.create_dataset("y", data=np.asarray(y))
