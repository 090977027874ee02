"""Checkpoint files in one process: round trip, corruption, atomicity under a kill, full disk,
the manifest's commit point, and which config changes a resume accepts."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from learners.data import BatchSampler
from pserver.ckpt import files as ck
from pserver.plan.config import Config


def _state(seed: int, n: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=n).astype(np.float32), "t": np.arange(4, dtype=np.int64)}


def test_round_trip_keeps_arrays_and_attrs(tmp_path: Path) -> None:
    arrays = _state(0)
    size = ck.write_state(tmp_path / "r.h5", arrays, {"step": 7, "clock": [1, 2]})
    assert size == (tmp_path / "r.h5").stat().st_size
    got = ck.read_state(tmp_path / "r.h5")
    assert got.attrs == {"step": 7, "clock": [1, 2]}
    assert set(got.arrays) == {"w", "t"}
    np.testing.assert_array_equal(got.arrays["w"], arrays["w"])
    assert got.arrays["w"].dtype == np.float32
    assert not list(tmp_path.glob("*.tmp"))


def test_a_changed_byte_is_refused_with_the_array_name(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    ck.write_state(path, _state(0), {})
    with h5py.File(path, "r+") as f:  # the bytes change, the stored checksum does not
        f["w"][3] = f["w"][3] + 1.0
    with pytest.raises(ck.CheckpointError, match="'w' is corrupt"):
        ck.read_state(path)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    ck.write_state(path, _state(0, 100_000), {})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ck.CheckpointError, match="cannot be read|corrupt"):
        ck.read_state(path)


def test_not_json_attrs_fail_before_touching_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    ck.write_state(path, _state(0), {"ok": 1})
    with pytest.raises(TypeError):
        ck.write_state(path, _state(1), {"bad": object()})
    assert ck.read_state(path).attrs == {"ok": 1}


def test_full_disk_keeps_the_previous_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "r.h5"
    before = _state(0)
    ck.write_state(path, before, {"g": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(h5py, "File", full)  # ck imports h5py where it writes
    with pytest.raises(ck.CheckpointError, match="No space left"):
        ck.write_state(path, _state(1), {"g": 2})
    monkeypatch.undo()
    got = ck.read_state(path)
    assert got.attrs == {"g": 1}
    np.testing.assert_array_equal(got.arrays["w"], before["w"])
    assert not list(tmp_path.glob("*.tmp"))


def test_a_kill_during_the_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """A child writes a big state and is killed once its temporary file exists: the name
    still holds the previous complete state."""
    path = tmp_path / "r.h5"
    ck.write_state(path, _state(0), {"g": 1})
    code = textwrap.dedent(f"""
        import numpy as np, sys
        from pserver.ckpt import files as ck
        big = {{f"a{{i}}": np.ones(4_000_000, np.float64) for i in range(40)}}
        print("writing", flush=True)
        ck.write_state({str(path)!r}, big, {{"g": 2}})
        print("done", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "writing"
    tmp = path.with_name(path.name + ck.TMP_SUFFIX)
    try:
        # the write takes seconds (1.3 GB); the kill must land while the temporary file grows
        deadline_reads = 0
        while not tmp.exists() and child.poll() is None and deadline_reads < 10_000_000:
            deadline_reads += 1
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    got = ck.read_state(path)
    assert got.attrs == {"g": 1}


def test_commit_names_the_generation_and_prunes_older_ones(tmp_path: Path) -> None:
    cfg = Config().to_dict()
    for g in (1, 2):
        for r in range(3):
            ck.write_state(ck.rank_file(tmp_path, g, r), _state(g + r), {"rank": r})
        ck.commit(tmp_path, g, 3, cfg, {"samples": g * 10})
    m = ck.latest(tmp_path)
    assert m is not None and (m.generation, m.world_size, m.extra) == (2, 3, {"samples": 20})
    assert [p.name for p in tmp_path.glob("g*")] == ["g000002"]
    assert m.config == json.loads(json.dumps(cfg))


def test_commit_refuses_a_generation_with_a_missing_rank(tmp_path: Path) -> None:
    ck.write_state(ck.rank_file(tmp_path, 1, 0), _state(0), {})
    with pytest.raises(ck.CheckpointError, match=r"ranks \[1\]"):
        ck.commit(tmp_path, 1, 2, {}, {})
    assert ck.latest(tmp_path) is None


def test_a_garbled_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / ck.MANIFEST).write_text("{not json")
    with pytest.raises(ck.CheckpointError, match="cannot be read"):
        ck.latest(tmp_path)


def test_resume_accepts_schedule_changes_and_refuses_the_rest() -> None:
    saved = Config().to_dict()
    new = Config()
    new.run.epochs = saved["run"]["epochs"] + 5
    new.optim.lr_milestones = [3]
    ck.check_compatible(saved, new.to_dict())
    new.optim.lr = 0.5
    new.data.batch_size = 7
    with pytest.raises(ck.CheckpointError, match=r"data.batch_size \(32 -> 7\).*optim.lr"):
        ck.check_compatible(saved, new.to_dict())


def test_sampler_state_continues_the_stream_exactly() -> None:
    a = BatchSampler(50, 7, seed=3)
    for _ in range(11):  # across an epoch boundary
        a.next()
    attrs, perm = a.state()
    attrs = json.loads(json.dumps(attrs))  # as it comes back from a checkpoint file
    b = BatchSampler(50, 7, seed=99)
    b.restore(attrs, perm)
    for _ in range(20):
        np.testing.assert_array_equal(a.next(), b.next())
    assert a.epoch == b.epoch
    with pytest.raises(ValueError, match="does not fit"):
        BatchSampler(51, 7, seed=0).restore(attrs, perm)
