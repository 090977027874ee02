"""Incremental HDF5 writer for the statistics dump (``stats.h5``).

The statistics server appends rows as the run goes. Each dataset's shape always equals the rows
written so far (no over-allocation to trim at close), so a run killed at any point leaves a file
that h5py opens as it was at the last flush. Two choices keep that true:

* the file is opened with HDF5's default (earliest) format, not ``libver="latest"``: the newer
  superblock carries "open for write" consistency flags, and a file whose writer died without
  closing it then refuses to open at all ("file is already open for write ... use h5clear").
  SWMR mode would avoid that but needs every reader to open with ``swmr=True`` and is meant for
  a fixed set of datasets, whereas this writer creates datasets lazily.
* chunks are stored uncompressed, so a chunk rewritten after a flush is rewritten in place; a
  filtered chunk changes size and moves, and the space HDF5 frees may be reused before the next
  flush while the on-disk metadata still points at it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

CHUNK_BYTES = 64 * 1024  # ~64 KiB chunks: cheap appends, few chunks for a long run
MAX_CLOCK_CHUNK_WIDTH = 64
CLOCK_PAD = -1  # padding of ragged vector-clock rows (timestamps are >= 0)


def _attr_value(value: Any) -> Any:
    """Convert a Python value to something h5py stores as an attribute (containers as JSON)."""
    if isinstance(value, (dict, list, tuple)) or value is None:
        return json.dumps(value, default=str)
    if isinstance(value, Path):
        return str(value)
    return value


def _chunk_rows(row_bytes: int) -> int:
    return max(64, CHUNK_BYTES // max(1, row_bytes))


class StatsWriter:
    """Append-only writer of the statistics dump; see ``docs/stats.md`` for the schema.

    Not thread-safe: one owner (the statistics server loop) calls it. Callers should batch rows
    (one ``append`` per received message or per flush period, not per scalar): each call resizes
    every dataset of the group once.
    """

    def __init__(
        self, path: str | Path, attrs: dict[str, Any], flush_interval: float = 2.0
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_interval = flush_interval
        self._file: h5py.File | None = h5py.File(self.path, "w")
        self._columns: dict[str, dict[str, h5py.Dataset]] = {}
        self._clocks: dict[str, h5py.Dataset] = {}
        self._last_flush = time.monotonic()
        self.set_attrs("/", **attrs)
        self.flush()  # the root attributes survive even if the run dies before the first rows

    @property
    def file(self) -> h5py.File:
        if self._file is None:
            raise ValueError(f"StatsWriter for {self.path} is closed")
        return self._file

    def append(self, group: str, **columns: Any) -> None:
        """Append rows to ``group/<column>``; every column is 1-D and of the same length.

        The first append of a group fixes its columns and their dtypes; later appends must give
        the same columns (values are cast to the stored dtype).
        """
        arrays = {name: np.asarray(values) for name, values in columns.items()}
        n = self._check_rows(group, arrays)
        if n == 0:
            return
        datasets = self._columns.get(group)
        if datasets is None:
            datasets = self._create_columns(group, arrays)
        elif datasets.keys() != arrays.keys():
            raise ValueError(
                f"append to {group!r}: columns {sorted(arrays)} differ from the group's "
                f"columns {sorted(datasets)}"
            )
        for name, values in arrays.items():
            ds = datasets[name]
            start = ds.shape[0]
            ds.resize((start + n,))
            ds[start:] = values

    def append_clocks(self, group: str, name: str, rows: list[Sequence[int]]) -> None:
        """Append ragged integer rows to the 2-D int64 dataset ``group/name``, padded with -1.

        The width grows to the widest row seen; older rows read -1 in the new columns (the
        dataset's fill value), so no row is rewritten.
        """
        if not rows:
            return
        width = max(len(row) for row in rows)
        block = np.full((len(rows), max(width, 1)), CLOCK_PAD, dtype=np.int64)
        for i, row in enumerate(rows):
            block[i, : len(row)] = row
        key = f"{group}/{name}"
        ds = self._clocks.get(key)
        if ds is None:
            ds = self._create_clocks(key, block.shape[1])
        start, old_width = ds.shape
        ds.resize((start + len(rows), max(old_width, block.shape[1])))
        ds[start:, : block.shape[1]] = block

    def set_attrs(self, group: str, **attrs: Any) -> None:
        """Set attributes on ``group`` ("/" or "" for the root); dicts and lists become JSON."""
        target = self.file if group in ("", "/") else self.file.require_group(group)
        for key, value in attrs.items():
            target.attrs[key] = _attr_value(value)

    def maybe_flush(self) -> None:
        """Flush if ``flush_interval`` seconds have passed since the last flush."""
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Write everything appended so far to disk: a crash after this keeps those rows."""
        self.file.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and close the file; closing twice is harmless."""
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None

    def __enter__(self) -> StatsWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_rows(self, group: str, arrays: dict[str, np.ndarray]) -> int:
        if not arrays:
            raise ValueError(f"append to {group!r}: no columns given")
        lengths = set()
        for name, values in arrays.items():
            if values.ndim != 1:
                raise ValueError(
                    f"append to {group!r}: column {name!r} has shape {values.shape}, "
                    "expected a 1-D array"
                )
            if values.dtype.kind not in "biuf":
                raise ValueError(
                    f"append to {group!r}: column {name!r} has dtype {values.dtype}, "
                    "expected a numeric or boolean dtype"
                )
            lengths.add(len(values))
        if len(lengths) != 1:
            lens = {name: len(values) for name, values in arrays.items()}
            raise ValueError(f"append to {group!r}: columns differ in length: {lens}")
        return lengths.pop()

    def _create_columns(self, group: str, arrays: dict[str, np.ndarray]) -> dict[str, h5py.Dataset]:
        grp = self.file.require_group(group)
        datasets = {}
        for name, values in arrays.items():
            datasets[name] = grp.create_dataset(
                name,
                shape=(0,),
                maxshape=(None,),
                dtype=values.dtype,
                chunks=(_chunk_rows(values.dtype.itemsize),),
            )
        self._columns[group] = datasets
        return datasets

    def _create_clocks(self, key: str, width: int) -> h5py.Dataset:
        chunk_width = min(MAX_CLOCK_CHUNK_WIDTH, 1 << (width - 1).bit_length())
        ds = self.file.create_dataset(
            key,
            shape=(0, width),
            maxshape=(None, None),
            dtype=np.int64,
            chunks=(_chunk_rows(8 * chunk_width), chunk_width),
            fillvalue=CLOCK_PAD,
        )
        self._clocks[key] = ds
        return ds
