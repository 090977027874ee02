"""The dump stays readable up to its last completed flush whatever happens to the writer, and
``pserver-stats`` answers a broken file with one line and exit status 2."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import h5py
import numpy as np
import pytest

from pserver.dump.reader import load_dump
from pserver.dump.writer import DumpWriteError, StatsWriter
from pserver.stats import cli
from tests.mpirun import QUICKSTART, run_job
from tests.test_stats_dump import ATTRS, write_hand_dump


def rows(w: StatsWriter, i: int, n: int = 200) -> None:
    w.append(
        "train", learner=np.full(n, i % 4, np.int32), step=np.arange(n) + i * n,
        loss=np.linspace(0, 1, n), time=np.full(n, float(i)),
    )  # fmt: skip


# ---------------------------------------------------------------- writer


def test_dump_name_only_ever_holds_complete_flushes(tmp_path):
    path = tmp_path / "stats.h5"
    w = StatsWriter(path, ATTRS)
    assert not path.exists()  # nothing published before the first flush
    rows(w, 0)
    w.flush()
    rows(w, 1)  # appended, not flushed: the published dump does not have it yet
    w.file.flush()
    assert load_dump(path).rows("train") == 200
    w.flush()
    assert load_dump(path).rows("train") == 400
    w.close()
    assert load_dump(path).rows("train") == 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.h5"]  # no working files left


def test_overwrite_keeps_the_old_dump_until_the_first_flush(tmp_path):
    path = write_hand_dump(tmp_path / "stats.h5")
    old = path.read_bytes()
    w = StatsWriter(path, {**ATTRS, "protocol": "async"})
    rows(w, 0)
    assert path.read_bytes() == old  # the new run may still die: the old dump is intact
    w.flush()
    assert load_dump(path).attrs["protocol"] == "async"
    w.close()


def test_failed_flush_leaves_the_last_complete_dump(tmp_path, monkeypatch):
    path = tmp_path / "stats.h5"
    w = StatsWriter(path, ATTRS)
    rows(w, 0)
    w.flush()
    rows(w, 1)

    def full(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)  # the rename of the new image fails
    with pytest.raises(DumpWriteError) as info:
        w.flush()
    text = str(info.value)
    assert "No space left on device" in text and "last complete flush" in text
    assert "\n" not in text
    with pytest.raises(DumpWriteError) as again:  # later calls refuse with the same error
        rows(w, 2)
    assert again.value is info.value
    w.close()
    assert load_dump(path).rows("train") == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.h5"]  # working file freed


def test_flush_cost_stretches_the_flush_interval(tmp_path):
    w = StatsWriter(tmp_path / "stats.h5", ATTRS, flush_interval=0.0)
    rows(w, 0)
    w.flush()
    assert w.copy_seconds and w._gap == pytest.approx(10 * w.copy_seconds[-1])
    w.close()


# ---------------------------------------------------------------- a real full disk


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs; skipped where mounting is impossible (not root, no CAP_SYS_ADMIN)."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {proc.stderr.strip() or 'mount failed'}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_full_disk_keeps_the_last_flush_readable(tiny_disk):
    path = tiny_disk / "stats.h5"
    w = StatsWriter(path, ATTRS)
    flushed = 0
    with pytest.raises(DumpWriteError) as info:
        for i in range(10_000):  # far more than 1 MiB: the disk fills on the way
            rows(w, i, 50)
            w.flush()
            flushed = 50 * (i + 1)
    assert "No space left on device" in str(info.value), info.value
    w.close()
    assert flushed > 0  # the test filled the disk after some complete flushes
    dump = load_dump(path)
    assert dump.rows("train") == flushed
    np.testing.assert_array_equal(dump.group("train")["step"], np.arange(flushed))
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["stats.h5"]  # the space is back


@pytest.mark.mpi
def test_full_disk_in_a_run_ends_it_with_one_error_and_a_readable_dump(tiny_disk):
    res = run_job(
        7,
        [str(QUICKSTART), f"run.out_dir={tiny_disk}", "run.epochs=20",
         "stats.flush_interval=0.05", "stats.progress=false"],
        timeout=120,
    )  # fmt: skip
    assert res.returncode != 0, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(errors) == 1 and "statistics dump" in errors[0], res.output
    assert "No space left on device" in errors[0] and "Traceback" not in res.output
    dump = tiny_disk / "stats.h5"
    if dump.exists():  # published before the disk filled: readable, as of its last flush
        assert cli.main(["summary", str(dump)]) == 0
    assert not (tiny_disk / "stats.h5.new").exists()


# ---------------------------------------------------------------- broken files, pserver-stats


def broken_files(tmp_path: Path) -> list[Path]:
    good = write_hand_dump(tmp_path / "good.h5")
    data = good.read_bytes()
    out = []
    for frac in (0.0, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99):
        p = tmp_path / f"cut{frac}.h5"
        p.write_bytes(data[: int(len(data) * frac)])
        out.append(p)
    rng = np.random.default_rng(0)
    for k in range(12):
        spoiled = bytearray(data)
        at = rng.integers(0, len(data), size=64)
        spoiled[int(at[0]) : int(at[0]) + 512] = bytes(rng.integers(0, 256, 512, dtype=np.uint8))
        for a in at[1:]:
            spoiled[int(a)] ^= 0xFF
        p = tmp_path / f"spoiled{k}.h5"
        p.write_bytes(bytes(spoiled))
        out.append(p)
    p = tmp_path / "zeros.h5"
    p.write_bytes(bytes(4096))
    out.append(p)
    # HDF5 intact, contents not what the writer makes
    for name, damage in {
        "no_groups": lambda f: [f.__delitem__(k) for k in list(f)],
        "learners_without_learner": lambda f: f.__delitem__("learners/learner"),
        "test_is_a_dataset": lambda f: (f.__delitem__("test"), f.create_dataset("test", data=1)),
        "text_column": lambda f: (
            f.__delitem__("gradients/staleness"),
            f.create_dataset("gradients/staleness", data=np.array([b"x"] * 7)),
        ),
        "column_3d": lambda f: (
            f.__delitem__("updates/lr"), f.create_dataset("updates/lr", data=np.zeros((3, 1, 1)))
        ),
        "config_not_json": lambda f: f.attrs.__setitem__("config", "{not json"),
        "error_as_ints": lambda f: (
            f.__delitem__("test/error"), f.create_dataset("test/error", data=np.zeros(0, int))
        ),
    }.items():
        p = tmp_path / f"{name}.h5"
        shutil.copyfile(good, p)
        with h5py.File(p, "a") as f:
            damage(f)
        out.append(p)
    return out


@pytest.mark.parametrize("command", ["summary", "plot"])
def test_pserver_stats_answers_broken_files_in_one_line(tmp_path, capsys, command):
    files = broken_files(tmp_path)
    if command == "plot":  # plots of files that still load take seconds each: fewer of them
        files = [p for p in files if not p.name.startswith(("spoiled", "cut0.9", "cut0.7"))]
    for path in files:
        args = [command, str(path)] + (["-o", str(tmp_path / "figs")] if command == "plot" else [])
        status = cli.main(args)
        err = capsys.readouterr().err
        if status == 0:  # damage the summary does not need: it still answers
            assert err == "", (path, err)
        else:
            assert status == 2 and err.count("\n") == 1, (path, err)
            assert err.startswith("pserver-stats: error: ") and str(path) in err, (path, err)


def test_pserver_stats_on_a_truncated_file_prints_no_hdf5_trace(tmp_path):
    good = write_hand_dump(tmp_path / "good.h5")
    cut = tmp_path / "cut.h5"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "summary", str(cut)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pserver-stats: error:")


def test_rows_appended_between_flushes_land_in_order_at_the_flush(tmp_path):
    """Appends are kept in memory and written as one block per column at the flush (the
    statistics server's cost per batch); the file holds every row in append order, the ragged
    clocks beside their rows, and ``rows()`` counts what is not flushed yet."""
    path = tmp_path / "stats.h5"
    w = StatsWriter(path, ATTRS)
    for i in range(5):
        rows(w, i, n=3)
        w.append_clocks("updates", "vector_clock", [[i] * (i + 1)])
    assert w.rows()["train"] == 15 and w.rows()["updates/vector_clock"] == 5
    rows(w, 5, n=3)
    w.close()
    with h5py.File(path, "r") as f:
        assert list(f["train/step"][:]) == list(range(18))
        assert list(f["train/time"][:]) == [float(i) for i in range(6) for _ in range(3)]
        clocks = f["updates/vector_clock"][:]
        assert clocks.shape == (5, 5)
        assert list(clocks[4]) == [4] * 5 and list(clocks[0]) == [0, -1, -1, -1, -1]
