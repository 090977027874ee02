"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): the IDX files, gzipped, as Debian's
``dataset-fashion-mnist`` installs them (``DEFAULT_DIR``) or from a directory the user names
(``data.dir``).

An IDX file is a big-endian header — two zero bytes, a type code (0x08: unsigned bytes), the
number of dimensions, then one uint32 per dimension — followed by the values in row-major order.
Every check a file can fail (missing, not gzip, truncated, wrong magic number, shape or size,
labels beyond 0..9) is a :class:`DataError` that names the file. MNIST's own files have the same
names and format, so ``data.dir`` may point at them too.

The parsing is a dozen lines of ``struct`` and ``numpy.frombuffer``: no package reads IDX with
these checks, and the readers that exist (``idx2numpy``) add a dependency for less.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from pserver.errors import DataError

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
N_CLASSES = 10
PARTS = ("train", "t10k")  # the official training and test sets
UBYTE = 0x08
INSTALL = (
    "install Debian's package (apt-get install dataset-fashion-mnist, or bash scripts/setup.sh "
    "as root) or set data.dir to a directory holding the four files "
    "{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz"
)


def files(directory: str, part: str) -> tuple[Path, Path]:
    """The (images, labels) files of ``part`` ("train" or "t10k") in ``directory``."""
    d = Path(directory or DEFAULT_DIR)
    return d / f"{part}-images-idx3-ubyte.gz", d / f"{part}-labels-idx1-ubyte.gz"


def header(path: Path, ndim: int) -> tuple[int, ...]:
    """The dimensions in ``path``'s IDX header (only the header is decompressed)."""
    with _opened(path) as f:
        try:
            head = f.read(4 + 4 * ndim)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(
                f"fashion-mnist file {str(path)!r} is not a readable gzip file: {e}"
            ) from None
    return _dims(path, head, ndim)


def read(path: Path, ndim: int) -> np.ndarray:
    """The values of ``path`` as uint8, shaped [N, prod(other dims)] (images) or [N] (labels),
    after checking the magic number and that the file holds exactly the values its header says."""
    with _opened(path) as f:
        try:
            raw = f.read()
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(
                f"fashion-mnist file {str(path)!r} is not a readable gzip file (truncated or "
                f"damaged?): {e}"
            ) from None
    dims = _dims(path, raw[: 4 + 4 * ndim], ndim)
    start, size = 4 + 4 * ndim, int(np.prod(dims))
    if len(raw) - start != size:
        raise DataError(
            f"fashion-mnist file {str(path)!r}: the header says {' x '.join(map(str, dims))} = "
            f"{size:,} values but the file holds {len(raw) - start:,}"
        )
    values = np.frombuffer(raw, dtype=np.uint8, offset=start)
    return values.reshape(dims[0], -1) if ndim > 1 else values


def labels(path: Path, n: int) -> np.ndarray:
    """The labels of ``path``: ``n`` of them (the images file's count), each in 0..9."""
    y = read(path, 1)
    if len(y) != n:
        raise DataError(
            f"fashion-mnist file {str(path)!r} has {len(y):,} labels but its images file "
            f"has {n:,} images"
        )
    if len(y) and int(y.max()) >= N_CLASSES:
        raise DataError(
            f"fashion-mnist file {str(path)!r} has a label {int(y.max())}, expected 0..9"
        )
    return y


def image_shape(directory: str) -> tuple[int, int, int]:
    """(training images, test images, pixels per image) from the two headers; both sets must
    have images of one size."""
    shapes = [header(files(directory, p)[0], 3) for p in PARTS]
    (n_train, *hw), (n_test, *hw_test) = shapes
    if hw != hw_test:
        raise DataError(
            f"fashion-mnist: the training images are {hw[0]} x {hw[1]} but the test images "
            f"{hw_test[0]} x {hw_test[1]} (files in {str(files(directory, 't10k')[0].parent)!r})"
        )
    return n_train, n_test, hw[0] * hw[1]


def load_part(directory: str, part: str) -> tuple[np.ndarray, np.ndarray]:
    """(X uint8 [N, pixels], y uint8 [N]) of ``part``, every check done."""
    images, label_file = files(directory, part)
    X = read(images, 3)
    return X, labels(label_file, len(X))


def _opened(path: Path) -> gzip.GzipFile:
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DataError(f"fashion-mnist file {str(path)!r} {what}: {INSTALL}")
    try:
        return gzip.open(path, "rb")
    except OSError as e:
        raise DataError(f"fashion-mnist file {str(path)!r} cannot be opened: {e}") from None


def _dims(path: Path, head: bytes, ndim: int) -> tuple[int, ...]:
    """Check the magic number (0, 0, unsigned bytes, ``ndim``) and return the dimensions."""
    name = f"fashion-mnist file {str(path)!r}"
    if len(head) < 4 + 4 * ndim:
        raise DataError(f"{name} ends inside its IDX header ({len(head)} bytes)")
    zero, kind, got = struct.unpack(">HBB", head[:4])
    if zero != 0 or kind != UBYTE or got != ndim:
        raise DataError(
            f"{name}: magic number 0x{head[:4].hex()}, expected 0x0000080{ndim} (an IDX file of "
            f"unsigned bytes with {ndim} dimensions)"
        )
    dims = struct.unpack(f">{ndim}I", head[4 : 4 + 4 * ndim])
    if any(d == 0 for d in dims):
        raise DataError(f"{name}: the header gives dimensions {dims}, expected none zero")
    return dims
