"""run.out_dir is tried before training: every way it can be unusable gets one ConfigError."""

from __future__ import annotations

import os

import pytest

from pserver.errors import ConfigError
from pserver.runtime.outdir import check_out_dir


def refused(path, overwrite=False) -> str:
    with pytest.raises(ConfigError) as info:
        check_out_dir(str(path), "stats.h5", overwrite)
    return str(info.value)


def test_usable_directory_is_created_and_left_clean(tmp_path):
    out = tmp_path / "a" / "b"
    assert check_out_dir(str(out), "stats.h5", False) == out / "stats.h5"
    assert out.is_dir() and list(out.iterdir()) == []  # the probe file is gone


def test_existing_file_and_path_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is an existing file, not a directory" in refused(f)
    assert "a part of the path is a file" in refused(f / "sub")


def test_dump_that_is_a_directory_or_a_symlink(tmp_path):
    (tmp_path / "d" / "stats.h5").mkdir(parents=True)
    assert "is not a file" in refused(tmp_path / "d", overwrite=True)
    os.symlink(tmp_path / "nowhere.h5", tmp_path / "stats.h5")  # dangling
    assert "is a symbolic link" in refused(tmp_path, overwrite=True)
    assert not (tmp_path / "nowhere.h5").exists()


def test_existing_dump_needs_overwrite(tmp_path):
    (tmp_path / "stats.h5").write_bytes(b"old")
    assert "run.overwrite=true" in refused(tmp_path)
    check_out_dir(str(tmp_path), "stats.h5", True)
    assert (tmp_path / "stats.h5").read_bytes() == b"old"  # not truncated by the check


def test_names_over_the_limits_and_virtual_file_systems(tmp_path):
    assert "longer than the file system allows" in refused(tmp_path / ("x" * 300))
    if os.path.isdir("/proc/self"):
        assert "cannot be created" in refused("/proc/pserver-test/run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert "does not take new files: permission denied" in refused(ro)
    finally:
        ro.chmod(0o755)


def test_a_run_directory_in_use_by_another_job_is_refused(tmp_path):
    """Issue 22 D3: a second job on a run directory in use is refused at start, naming the
    holder; the same process may check its own directory again; the lock ends with the job."""
    import subprocess
    import sys

    hold = (
        "import sys\nfrom pserver.runtime.outdir import check_out_dir\n"
        f"check_out_dir({str(tmp_path)!r}, 'stats.h5', False)\n"
        "print('held', flush=True)\nsys.stdin.read()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline().strip() == "held"  # the other job holds it now
        with pytest.raises(ConfigError, match=r"is in use by another job"):
            check_out_dir(str(tmp_path), "stats.h5", False)
    finally:
        other.communicate("", timeout=60)
    assert check_out_dir(str(tmp_path), "stats.h5", False) == tmp_path / "stats.h5"
    assert check_out_dir(str(tmp_path), "stats.h5", False) == tmp_path / "stats.h5"  # again
