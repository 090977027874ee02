"""Is ``run.out_dir`` usable? Checked by trying, before training, on the statistics server's rank.

The statistics server creates the directory and the dump once training has started; any
problem there (an existing file in the way, a path under a file, a read-only or virtual file
system, a name over the system's limits, ``stats.h5`` a directory or a symbolic link) then ends
the job with a traceback after the others have started. Asking ``os.access`` would not do
(root passes every permission test, NFS and read-only mounts answer wrongly), so this creates
the directory and a temporary file in it, exactly as the writer will.

The same rank then holds an advisory lock on the directory (``flock`` on the directory itself,
so no file is left in it) for
the job's life, so a second job on a run directory in use (two ``--resume`` of one run, two
runs sharing an ``out_dir``) is refused at start with one line instead of failing later on
HDF5's file lock. The kernel drops the lock when the process ends, however it ends, so a
killed or requeued job never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

from pserver.errors import ConfigError

WHY = {
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EEXIST: "a part of the path is a file, not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENAMETOOLONG: "a name is longer than the file system allows",
    errno.ENOSPC: "the file system is full",
    errno.EDQUOT: "the disk quota is exceeded",
}


#: directory -> the open directory this process holds locked (a second flock of the same file from
#: another descriptor would conflict with our own, so a process locks a directory once)
_HELD: dict[Path, int] = {}
#: directories check_out_dir created, deepest first (removed again by undo_out_dir)
_MADE: list[Path] = []


def why(e: OSError) -> str:
    return WHY.get(e.errno or 0, e.strerror or str(e))


def check_out_dir(out_dir: str, dump_name: str, overwrite: bool) -> Path:
    """Create ``out_dir`` (with parents) and prove it takes a new file; return the dump path.

    Raises :class:`ConfigError` naming ``run.out_dir`` and the reason.
    """
    out = Path(out_dir)
    key = f"run.out_dir = {out_dir!r}"
    try:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{key} is an existing file, not a directory: choose another path")
        made = [d for d in (out, *out.parents) if not d.exists()]  # deepest first
        out.mkdir(parents=True, exist_ok=True)
        _MADE[:0] = made
    except OSError as e:  # also from exists(): a name too long cannot even be looked up
        raise ConfigError(f"{key} cannot be created: {why(e)}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".pserver-check-") as f:
            f.write(b"pserver")
            f.flush()
    except OSError as e:
        raise ConfigError(f"{key} does not take new files: {why(e)}") from None
    lock_run_dir(out, key)
    dump = out / dump_name
    try:
        check_dump(dump, key, overwrite)
    except OSError as e:
        raise ConfigError(f"{key}: {dump} cannot be checked: {why(e)}") from None
    return dump


def check_dump(dump: Path, key: str, overwrite: bool) -> None:
    """The dump must be a regular file or absent: never written through a link or onto a
    directory, and replaced only when asked."""
    if dump.is_symlink():
        raise ConfigError(
            f"{key}: {dump} is a symbolic link; pserver writes its dump only as a file of its "
            "own (a link could make it overwrite another file): remove the link"
        )
    if not dump.exists():
        return
    if not dump.is_file():
        raise ConfigError(
            f"{key}: {dump} exists and is not a file: remove it or choose another run.out_dir"
        )
    if not overwrite:
        raise ConfigError(
            f"{dump} already holds a dump: pass run.overwrite=true to replace it, or choose "
            "another run.out_dir"
        )
    try:
        fd = os.open(dump, os.O_RDWR)  # no truncation: the old dump stays until training
        os.close(fd)
    except OSError as e:
        raise ConfigError(f"{key}: {dump} cannot be replaced: {why(e)}") from None


def undo_out_dir() -> None:
    """Release the lock and remove the directories :func:`check_out_dir` created, where they
    are still empty: bad input found on another rank ended the job before it started, and a
    refused run leaves nothing behind (issue 22)."""
    for fd in _HELD.values():
        os.close(fd)
    _HELD.clear()
    for d in _MADE:
        try:
            d.rmdir()
        except OSError:  # not empty (another job's, or a parent in use): leave it
            break
    _MADE.clear()


def lock_run_dir(out: Path, key: str) -> None:
    """Hold ``out``'s advisory lock until this process ends, or refuse: another job has it."""
    out = out.resolve()
    if out in _HELD:
        return
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise ConfigError(f"{key} cannot be opened: {why(e)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"{key} is in use by another job (it holds the directory's lock): wait for that job "
            "to end, or choose another run.out_dir"
        ) from None
    except OSError as e:  # a file system without locks: say so rather than run unguarded
        os.close(fd)
        raise ConfigError(f"{key} cannot be locked: {why(e)}") from None
    _HELD[out] = fd
