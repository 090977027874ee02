"""Checkpoint files: every rank's state in its own HDF5 file, a generation committed by a manifest.

Layout under ``RUN_DIR/checkpoint/``::

    g000012/rank-00003.h5    rank 3's state at generation 12
    LATEST                   JSON: generation, world size, time, config, per-rank checksums

Writing a generation is two-phase. Each rank writes its file atomically (:func:`write_state`:
a temporary file in the same directory, ``fsync``, ``os.replace``, ``fsync`` of the directory),
and reports success; once every rank has, one rank replaces ``LATEST`` the same way
(:func:`commit`). ``LATEST`` is the commit point: a job killed at any moment leaves either the
old manifest, naming the previous complete generation, or the new one, naming a complete new
generation. The previous generation's directory is removed only after the new ``LATEST`` is in
place, so there is always one complete generation on disk once the first has been committed.
A write that fails (a full disk, a quota) raises :class:`CheckpointError` with the reason,
removes its temporary file and leaves the previous generation as it was.

What a rank stores is its business (its role decides): named arrays and JSON attributes, never
pickles. Every array carries a CRC-32 of its bytes, checked when it is read back, so a file
that was truncated or bit-flipped after it was written is refused with the name of the array,
not silently resumed from; ``LATEST`` carries the SHA-256 of every rank file, checked before the
file is opened, so a rank file swapped for another consistent one is refused too.

A checkpoint is untrusted input (a run directory may be shared, copied or edited): nothing that
is not a regular file is opened (a FIFO would block the reader for good), and a rank file's
entries must be datasets stored in the file itself — an external or soft link, a virtual
dataset or external raw storage would make the resume read a file the run never wrote
(``pserver.ckpt.h5stored``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pserver.ckpt.h5stored import GROUP, LINK, OUTSIDE, stored
from pserver.errors import PserverError

FORMAT = 2  # bumped when the layout of a rank file or the manifest changes
MANIFEST = "LATEST"
TMP_SUFFIX = ".tmp"

#: Config keys a resumed run may change (``--resume`` with overrides); every other key must
#: equal the checkpointed run's. Schedules and lengths change what happens next, not what the
#: saved state means; logging, progress and wait tuning change nothing in the arithmetic.
MAY_CHANGE = frozenset({
    "run.epochs", "run.log_level", "run.checkpoint_interval", "run.out_dir", "run.overwrite",
    "run.blas_threads", "optim.lr_milestones", "optim.lr_gamma", "optim.warmup_epochs",
    "optim.warmup_start", "optim.lr_decay", "optim.lr_decay_from",
    "stats.flush_interval", "stats.progress", "stats.test_every", "stats.buffer_rows",
    "stats.progress_every", "stats.tensorboard",
    "comm.stall_timeout", "comm.poll_min", "comm.poll_max", "comm.switch_interval",
    "model.init_from",  # a resumed run's weights are its checkpoint's (pserver.ckpt.warm_start)
    # pserver-sim's cost model: a real run reads none of it (a checkpoint older than [sim] has none)
    "sim.loop", "sim.compute", "sim.compute_cv", "sim.step_overhead", "sim.latency",
    "sim.bandwidth", "sim.message_time", "sim.update_per_byte", "sim.data_time",
    "sim.latency_cv", "sim.start_time", "sim.end_time",
})


class CheckpointError(PserverError):
    """A checkpoint that cannot be written, read or resumed from; the message says why."""


@dataclass(frozen=True)
class State:
    """One rank's checkpointed state: named arrays and JSON-able attributes."""

    arrays: dict[str, np.ndarray]
    attrs: dict[str, Any]


@dataclass(frozen=True)
class Manifest:
    """What ``LATEST`` says: the committed generation and the run it belongs to."""

    generation: int
    world_size: int
    time: float
    config: dict[str, Any]
    extra: dict[str, Any]
    #: rank -> SHA-256 (hex) of its file in this generation
    sha256: dict[int, str] = field(default_factory=dict)


def generation_dir(ckpt_dir: str | Path, generation: int) -> Path:
    return Path(ckpt_dir) / f"g{generation:06d}"


def rank_file(ckpt_dir: str | Path, generation: int, rank: int) -> Path:
    return generation_dir(ckpt_dir, generation) / f"rank-{rank:05d}.h5"


def discard_generation(ckpt_dir: str | Path, generation: int) -> int:
    """Remove the rank files of a generation that was not committed (some rank could not write
    its own): they would only hold space a full disk lacks, the dump's next flush included.
    Anything else found there (not a regular rank file) is left alone. Returns the files
    removed."""
    where = generation_dir(ckpt_dir, generation)
    if where.is_symlink() or not where.is_dir():
        return 0
    removed = 0
    for f in where.glob("rank-*.h5*"):  # a writer's leftover .tmp too
        if f.is_file() and not f.is_symlink():
            f.unlink(missing_ok=True)
            removed += 1
    try:
        where.rmdir()
    except OSError:  # not empty: something of someone else's
        pass
    return removed


def _fsync_dir(path: Path) -> None:
    # the rename is durable only once the directory entry is: fsync the directory itself
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def attr(
    attrs: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    where: str,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    """``attrs[name]``, refused unless it is a ``kind`` within ``[low, high]``.

    A rank file's JSON attributes are untrusted input (issue 22, D4): a restore that took
    ``int("x")``, ``0`` rows or a negative step count would crash after start-up or silently
    cut the dump, so every attribute a role reads back is checked here first. ``bool`` is not
    an ``int`` here; an ``int`` is a ``float``.
    """
    if name not in attrs:
        raise CheckpointError(f"{where}: the checkpoint lacks the attribute {name!r}")
    value = attrs[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        kinds = (*kinds, int)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join(k.__name__ for k in kinds)
        raise CheckpointError(
            f"{where}: the checkpoint's {name!r} is {value!r}, expected {wanted}"
        )
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise CheckpointError(
            f"{where}: the checkpoint's {name!r} is {value!r}, expected a value in {bounds}"
        )
    return value


def counts(attrs: Mapping[str, Any], name: str, where: str, low: int = 0) -> Any:
    """``attrs[name]``, a mapping or list of integers >= ``low`` (row counts, clocks, epochs)."""
    value = attr(attrs, name, (dict, list), where)
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, _ in items:
        attr({f"{name}[{key}]": value[key]}, f"{name}[{key}]", int, where, low)
    return value


def pairs(attrs: Mapping[str, Any], name: str, where: str, low: int = 0) -> list[Any]:
    """``attrs[name]``, a list of ``[key, value]`` integer pairs, each >= ``low`` (a learner's
    block timestamps, a round's latest tags)."""
    value = attr(attrs, name, list, where)
    for i, pair in enumerate(value):
        if not isinstance(pair, list) or len(pair) != 2:
            raise CheckpointError(f"{where}: the checkpoint's {name}[{i}] is {pair!r}, not a pair")
        for j, v in enumerate(pair):
            attr({f"{name}[{i}][{j}]": v}, f"{name}[{i}][{j}]", int, where, low)
    return value


def _checksum(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)


def _atomic(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)``, fsync the result and rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except (OSError, RuntimeError) as e:
        # HDF5 reports a full disk when the file is closed, as RuntimeError, not OSError
        tmp.unlink(missing_ok=True)
        reason = getattr(e, "strerror", None) or str(e)
        raise CheckpointError(f"cannot write checkpoint {path}: {reason}") from None


def write_state(path: str | Path, arrays: Mapping[str, Any], attrs: Mapping[str, Any]) -> int:
    """Write one rank's state atomically; return the file's size in bytes.

    ``arrays``: host arrays (copy device arrays to the host first); ``attrs``: JSON-able
    values. Raises :class:`CheckpointError` if the file cannot be written; ``path`` then still
    holds whatever it held before.
    """
    host = {name: np.asarray(a) for name, a in arrays.items()}
    text = json.dumps(dict(attrs), sort_keys=True)  # fails here, before any file, if not JSON

    def write(tmp: Path) -> None:
        import h5py  # here: a run without checkpoints never pays its import (start-up)

        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["attrs"] = text
            for name, a in host.items():
                d = f.create_dataset(name, data=a)
                d.attrs["crc32"] = _checksum(a)

    target = Path(path)
    _atomic(target, write)
    return target.stat().st_size


def expect(state: State, name: str, shape: tuple[int, ...], dtype: Any, where: str) -> Any:
    """The array ``name`` of ``state``, refused unless it has ``shape`` and ``dtype``."""
    a = state.arrays.get(name)
    if a is None:
        raise CheckpointError(f"{where}: the checkpoint lacks {name!r}")
    if tuple(a.shape) != tuple(shape) or str(a.dtype) != str(dtype):
        raise CheckpointError(
            f"{where}: {name!r} is {a.dtype}{list(a.shape)} in the checkpoint, this run needs "
            f"{dtype}{list(shape)} (the model or the data changed)"
        )
    return a


def regular_file(path: str | Path, what: str) -> Path:
    """``path`` if it is a regular file (links followed), else :class:`CheckpointError`.

    Checked with ``stat`` before anything opens it: opening a FIFO blocks until a writer
    comes, a device or a directory is not a checkpoint.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as e:
        raise CheckpointError(f"{what} {p} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else (
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
        )
        raise CheckpointError(f"{what} {p} is {kind}, not a regular file: refused")
    return p


def sha256(path: str | Path) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_state(path: str | Path, expected_sha256: str | None = None) -> State:
    """Read and verify one rank's state; :class:`CheckpointError` names what is wrong.

    ``expected_sha256``: the manifest's checksum of this file, compared before it is opened.
    """
    regular_file(path, "checkpoint")
    if expected_sha256 is not None and sha256(path) != expected_sha256:
        raise CheckpointError(
            f"checkpoint {path}: its SHA-256 differs from the one LATEST recorded (the file was "
            f"replaced or changed after the generation was committed): refused"
        )
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if int(f.attrs.get("format", -1)) != FORMAT:
                raise CheckpointError(
                    f"checkpoint {path}: format {f.attrs.get('format')!r}, this pserver reads "
                    f"format {FORMAT}"
                )
            attrs = json.loads(str(f.attrs["attrs"]))
            if not isinstance(attrs, dict):
                raise CheckpointError(f"checkpoint {path}: its attributes are not a JSON object")
            arrays = {name: _stored_array(f, name, path) for name in f}
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e}") from None
    return State(arrays, attrs)


def _stored_array(f: Any, name: str, path: str | Path) -> np.ndarray:
    """The verified array ``name`` of an open rank file; links and outside storage refused."""
    d, problem, detail = stored(f, name)
    if problem is not None:
        what = {
            LINK: f"is a {detail} (a link), not an array stored in the file",
            GROUP: "is a group, not an array",
            OUTSIDE: "keeps its data outside the file (virtual dataset or external storage)",
        }.get(problem, "is missing")
        raise CheckpointError(f"checkpoint {path}: {name!r} {what}: refused")
    if d.dtype.kind not in "biufc":
        raise CheckpointError(f"checkpoint {path}: {name!r} holds {d.dtype}, not numbers")
    if d.id.get_storage_size() != d.nbytes:  # before allocating: a 2**40-element dataset of
        # unwritten chunks costs a few bytes of file and 4 TiB of memory; write_state stores
        # every array whole and uncompressed
        raise CheckpointError(
            f"checkpoint {path}: {name!r} declares {d.dtype}{list(d.shape)} ({d.nbytes} bytes) "
            f"but stores {d.id.get_storage_size()} bytes: refused"
        )
    a = np.asarray(d[()])
    if _checksum(a) != int(d.attrs["crc32"]):
        raise CheckpointError(f"checkpoint {path}: array {name!r} is corrupt (checksum mismatch)")
    return a


def commit(
    ckpt_dir: str | Path,
    generation: int,
    world_size: int,
    config: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Make ``generation`` the one to resume from, then remove the older generations.

    Call only once every rank's file of ``generation`` is written (the caller's agreement).
    Newer generations' directories (being written, or left by a run killed later) stay.
    """
    root = Path(ckpt_dir)
    missing = [r for r in range(world_size) if not rank_file(root, generation, r).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint generation {generation} lacks the files of ranks {missing[:8]}"
        )
    body = {
        "format": FORMAT, "generation": generation, "world_size": world_size,
        "time": time.time(), "config": dict(config), "extra": dict(extra or {}),
        "sha256": {str(r): sha256(rank_file(root, generation, r)) for r in range(world_size)},
    }
    text = json.dumps(body, sort_keys=True, indent=1)
    _atomic(root / MANIFEST, lambda tmp: tmp.write_text(text))
    for old in root.glob("g[0-9]*"):
        # only older ones: with periodic checkpoints the ranks may already be writing the
        # next generation while this one is committed (pserver.ckpt.drivers.periodic)
        if old.is_dir() and old.name[1:].isdigit() and int(old.name[1:]) < generation:
            shutil.rmtree(old, ignore_errors=True)


def latest(ckpt_dir: str | Path) -> Manifest | None:
    """The committed generation, or None when nothing was ever committed."""
    path = Path(ckpt_dir) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    regular_file(path, "checkpoint manifest")
    try:
        body = json.loads(path.read_text())
        if body.get("format") != FORMAT:
            raise CheckpointError(
                f"{path}: format {body.get('format')!r}, this pserver reads format {FORMAT}"
            )
        sums = {int(r): str(s) for r, s in dict(body["sha256"]).items()}
        manifest = Manifest(
            int(body["generation"]), int(body["world_size"]), float(body["time"]),
            dict(body["config"]), dict(body.get("extra", {})), sums,
        )
        if manifest.generation < 0 or manifest.world_size < 1:
            raise ValueError("generation < 0 or world_size < 1")
        if set(sums) != set(range(manifest.world_size)):
            raise ValueError(f"checksums for ranks {sorted(sums)[:8]}, not 0..world_size-1")
        return manifest
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} cannot be read: {e}") from None


def flatten(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"run": {"epochs": 3}}`` -> ``{"run.epochs": 3}``."""
    return {f"{s}.{k}": v for s, keys in config.items() for k, v in keys.items()}


def check_compatible(
    saved: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]], hint: str = ""
) -> None:
    """Refuse a resume whose config changes a key outside :data:`MAY_CHANGE`.

    ``saved``, ``new``: ``Config.to_dict()`` of the checkpointed and the resuming run;
    ``hint``: appended to the refusal (how to resume instead).
    """
    old, now = flatten(saved), flatten(new)
    changed = sorted(k for k in old.keys() | now.keys() if old.get(k) != now.get(k))
    refused = [k for k in changed if k not in MAY_CHANGE]
    if refused:
        shown = ", ".join(f"{k} ({old.get(k)!r} -> {now.get(k)!r})" for k in refused[:4])
        more = f" and {len(refused) - 4} more" if len(refused) > 4 else ""
        raise CheckpointError(
            f"--resume: the config differs from the checkpointed run's in {shown}{more}; "
            f"a resumed run may change only {', '.join(sorted(MAY_CHANGE))}{hint}"
        )
