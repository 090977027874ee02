"""Readable but malformed HDF5 inputs are bad input, refused before anything is allocated
(issue 22, D8): each raises pserver's own error (one ``pserver-run: error:`` line, exit 2, in a
job), where the code before raised ``OSError``, ``RuntimeError``, ``MemoryError`` or
``ValueError`` (exit 1, "failed while preparing the run").
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from learners.data import DataError, describe_dataset, load_dataset
from pserver.ckpt import files as ck
from pserver.ckpt.warm_start import load_initial_weights
from pserver.errors import ConfigError
from pserver.plan.config import DataConfig

MODEL = {"kind": "mlp"}


def dump(path: Path, n: int = 10) -> Path:
    """A small dump with a final model of ``n`` float32 values."""
    with h5py.File(path, "w") as f:
        f.attrs["config"] = json.dumps({"model": MODEL})
        f["model/weights"] = np.ones(n, np.float32)
    return path


def test_a_truncated_warm_start_dump_is_refused(tmp_path: Path) -> None:
    whole = dump(tmp_path / "whole.h5").read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match="cannot be read .truncated or corrupt"):
        load_initial_weights(str(cut), MODEL, 10, np.float32)


def test_a_bit_flipped_warm_start_dump_is_refused(tmp_path: Path) -> None:
    flipped = bytearray(dump(tmp_path / "d.h5").read_bytes())
    flipped[8] ^= 0xFF  # the superblock's version: HDF5 still sees its signature
    (tmp_path / "d.h5").write_bytes(bytes(flipped))
    with pytest.raises(ConfigError, match="cannot be read .truncated or corrupt"):
        load_initial_weights(str(tmp_path / "d.h5"), MODEL, 10, np.float32)


def test_a_warm_start_dump_of_2_40_values_is_refused_not_allocated(tmp_path: Path) -> None:
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:
        f.attrs["config"] = json.dumps({"model": MODEL})
        f.create_dataset("model/weights", shape=(2**40,), dtype="f4")  # a few bytes on disk
    with pytest.raises(ConfigError, match="model.init_from"):
        load_initial_weights(str(path), MODEL, 2**40, np.float32)


def test_a_rank_file_array_of_2_40_values_is_refused_before_it_is_allocated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rank.h5"
    ck.write_state(path, {"t": np.arange(3)}, {"role": "server"})
    with h5py.File(path, "r+") as f:
        f.create_dataset("w", shape=(2**40,), dtype="f4", chunks=(2**20,))
        f["w"].attrs["crc32"] = 0
    with pytest.raises(ck.CheckpointError, match=r"'w' declares float32\[1099511627776\]"):
        ck.read_state(path)


def data_file(path: Path, X: np.ndarray, y: np.ndarray) -> str:
    with h5py.File(path, "w") as f:
        f["X"], f["y"] = X, y
    return str(path)


@pytest.mark.parametrize("load", [describe_dataset, load_dataset])
def test_an_empty_data_file_is_refused(tmp_path: Path, load) -> None:  # noqa: ANN001
    path = data_file(tmp_path / "e.h5", np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    with pytest.raises(DataError, match=r"X has shape \(0, 4\), expected N x F with N, F >= 1"):
        load(DataConfig(source="hdf5", path=path, batch_size=4), 0)


def test_labels_of_more_than_one_value_per_sample_are_refused_before_reading(
    tmp_path: Path,
) -> None:
    path = tmp_path / "y.h5"
    with h5py.File(path, "w") as f:
        f["X"] = np.zeros((8, 4), np.float32)
        f.create_dataset("y", shape=(8, 2**37), dtype="i8", chunks=(1, 2**20))  # 8 TiB
    with pytest.raises(DataError, match="length mismatch"):
        describe_dataset(DataConfig(source="hdf5", path=str(path), batch_size=4), 0)
