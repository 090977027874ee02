"""A checkpoint is untrusted input (issue 22, D1, D2, D4, D7), in one process.

On the code before: a rank file whose ``w`` was an external link, a soft link, external raw
storage or a virtual dataset was read through (D1); HDF5's full disk at close, a
``RuntimeError``, escaped as a traceback (D2); ``LATEST`` held no per-rank checksum, so a rank
file swapped for another consistent one was accepted (D4); a FIFO in place of ``LATEST`` or of a
rank file blocked the reader for good (D7).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from pserver.ckpt import files as ck


def _write(path: Path, w: np.ndarray) -> None:
    ck.write_state(path, {"w": w, "t": np.arange(3)}, {"role": "server"})


def _relink(path: Path, kind: str, outside: Path) -> None:
    """Replace ``w`` in ``path`` by a ``kind`` reference to data the run did not write."""
    with h5py.File(outside, "w") as g:
        g["w"] = np.full(8, 3.0, np.float32)
    with h5py.File(path, "r+") as f:
        crc = int(f["w"].attrs["crc32"])
        del f["w"]
        if kind == "external-link":
            f["w"] = h5py.ExternalLink(str(outside), "w")
        elif kind == "soft-link":
            f["elsewhere"] = other = np.full(8, 3.0, np.float32)
            f["elsewhere"].attrs["crc32"] = ck._checksum(other)  # a consistent array...
            f["w"] = h5py.SoftLink("/elsewhere")
        elif kind == "external-storage":
            raw = outside.with_suffix(".raw")
            raw.write_bytes(np.full(8, 3.0, np.float32).tobytes())
            f.create_dataset("w", shape=(8,), dtype=np.float32, external=[(str(raw), 0, 32)])
        else:
            layout = h5py.VirtualLayout(shape=(8,), dtype=np.float32)
            layout[:] = h5py.VirtualSource(str(outside), "w", shape=(8,))
            f.create_virtual_dataset("w", layout)
        if kind not in ("external-link", "soft-link"):  # a link's attrs are its target's
            f["w"].attrs["crc32"] = crc


@pytest.mark.parametrize(
    "kind", ["external-link", "soft-link", "external-storage", "virtual-dataset"]
)
def test_a_rank_file_that_points_outside_itself_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "rank-00000.h5"
    _write(path, np.zeros(8, np.float32))
    _relink(path, kind, tmp_path / "outside.h5")
    with pytest.raises(ck.CheckpointError, match=r"'w' (is a|keeps its data outside).*refused"):
        ck.read_state(path)


def test_a_full_disk_reported_at_close_is_a_checkpoint_error(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "r.h5"
    _write(path, np.zeros(8, np.float32))
    before = path.read_bytes()

    def full(*a, **kw):  # what h5py raises when HDF5 flushes onto a full disk at close
        raise RuntimeError("Unable to close file (file write failed: errno = 28)")

    monkeypatch.setattr(h5py, "File", full)  # ck imports h5py where it writes
    with pytest.raises(ck.CheckpointError, match="cannot write checkpoint.*errno = 28"):
        _write(path, np.ones(8, np.float32))
    assert path.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def _generation(root: Path, world: int = 2) -> None:
    for r in range(world):
        _write(ck.rank_file(root, 1, r), np.full(8, r, np.float32))
    ck.commit(root, 1, world, {"run": {"epochs": 1}})


def test_latest_carries_every_rank_files_sha256(tmp_path: Path) -> None:
    _generation(tmp_path)
    m = ck.latest(tmp_path)
    assert set(m.sha256) == {0, 1}
    assert m.sha256[1] == ck.sha256(ck.rank_file(tmp_path, 1, 1))
    ck.read_state(ck.rank_file(tmp_path, 1, 1), m.sha256[1])  # accepted as written


def test_a_rank_file_swapped_for_another_consistent_one_is_refused(tmp_path: Path) -> None:
    _generation(tmp_path)
    m = ck.latest(tmp_path)
    path = ck.rank_file(tmp_path, 1, 1)
    _write(path, np.full(8, 3.0, np.float32))  # valid CRCs, other weights
    ck.read_state(path)  # the file alone is consistent...
    with pytest.raises(ck.CheckpointError, match="SHA-256 differs"):
        ck.read_state(path, m.sha256[1])  # ...but not the one LATEST committed


def test_a_manifest_without_checksums_is_refused(tmp_path: Path) -> None:
    _generation(tmp_path)
    body = (tmp_path / ck.MANIFEST).read_text().replace('"sha256"', '"unused"')
    (tmp_path / ck.MANIFEST).write_text(body)
    with pytest.raises(ck.CheckpointError, match="cannot be read"):
        ck.latest(tmp_path)


def _refused_without_blocking(call: str, tmp_path: Path) -> str:
    """Run ``call`` (code using ``ck`` and ``tmp``) in a child Python: what it printed. A reader
    that blocks on a FIFO blocks its whole process (HDF5 keeps the GIL), hence the child; the
    timeout bounds a hang, it synchronizes nothing."""
    code = (
        "from pathlib import Path\nfrom pserver.ckpt import files as ck\n"
        f"tmp = Path({str(tmp_path)!r})\n"
        f"try:\n    {call}\nexcept ck.CheckpointError as e:\n    print('refused:', e)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the reader blocked on a FIFO")
    return out.stdout + out.stderr


def test_a_fifo_as_latest_is_refused_without_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ck.MANIFEST)
    out = _refused_without_blocking("ck.latest(tmp)", tmp_path)
    assert "refused:" in out and "is a FIFO" in out, out


def test_a_fifo_as_a_rank_file_is_refused_without_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "rank-00000.h5")
    out = _refused_without_blocking("ck.read_state(tmp / 'rank-00000.h5')", tmp_path)
    assert "refused:" in out and "is a FIFO" in out, out
