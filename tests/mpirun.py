"""Launch real ``mpiexec`` jobs from tests, each under a hard timeout that kills the whole job.

Thin wrappers over :mod:`pserver.job.launch`: the launcher and its flags come from
``PSERVER_MPIEXEC`` / ``PSERVER_MPIEXEC_FLAGS`` (``docs/launching.md``).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pserver.job import launch

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.toml"

Result = launch.Completed  # returncode, stdout, stderr, output (and cmd, seconds, reason)


def mpiexec() -> str:
    """The launcher program: ``$PSERVER_MPIEXEC``, else the .venv's mpiexec, else PATH's."""
    try:
        return launch.mpiexec_program()
    except launch.LaunchError as e:
        raise RuntimeError(str(e)) from None


@functools.cache
def launcher_is_hydra() -> bool:
    """Whether the launcher is MPICH's Hydra (``mpiexec --version`` names it); tests that
    drive Hydra's own options skip under another launcher (Open MPI's ``mpirun``)."""
    try:
        res = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return False
    return "HYDRA" in (res.stdout + res.stderr).upper()


def run_job(
    n: int,
    args: list[str],
    timeout: float = 120.0,
    cwd: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Sequence[str] = (),
) -> Result:
    """``mpiexec -n N python -m pserver.job.cli ARGS``; a job past ``timeout`` is killed and fails.

    ``env``: variables added to this process's environment for the job; ``flags``: launcher
    flags added after those of ``$PSERVER_MPIEXEC_FLAGS``.
    """
    cmd = launch.mpi_command(n, [*launch.pserver_cli(), *args], [*launch.launcher(), *flags])
    job_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    res = launch.run(cmd, timeout, env=job_env, cwd=cwd or ROOT)
    if res.reason:
        raise AssertionError(
            f"mpiexec -n {n} {' '.join(args)} hung for {timeout:.0f} s\n{res.stdout}\n{res.stderr}"
        )
    return res


def train(
    tmp_path: Path,
    n: int,
    *overrides: str,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    flags: Sequence[str] = (),
) -> Result:
    """The quickstart config with overrides, writing into ``tmp_path``; asserts a clean exit."""
    res = run_job(
        n,
        [str(QUICKSTART), f"run.out_dir={tmp_path}", "stats.progress=false", *overrides],
        timeout,
        env=env,
        flags=flags,
    )
    assert res.returncode == 0, res.output
    return res


def assert_learned(dump, best: float = 0.04, final: float = 0.06) -> None:  # noqa: ANN001
    """20 epochs of the quickstart MLP on the digits learned: the test error reached ``best``
    at some test and ended at most ``final`` (chance is 0.9).

    Measured with the quickstart's learning-rate decay: final 1.6-2.4 %; without it the last
    epochs wander by a few of the 450 test images, final 3.3-4.7 %, best 1.3-2.2 %
    (docs/protocols.md, "Measured staleness"). The bounds hold for both. Over two whole suite
    runs (``PSERVER_ACCURACY_LOG``) the 43 accuracy tests' best errors were 1.56-3.56 %: the
    free-running and timing-dependent runs (ADPSGD, BMUF, a tree) differ by ±4 images from run
    to run, and four ended within 2.5 images of the 3 % bound this used to be (one crossed it
    in CI at 3.11 %), hence 4 %: still a model that learned (chance is 90 %).
    """
    err = dump.group("test")["error"]
    log = os.environ.get("PSERVER_ACCURACY_LOG")
    if log:  # the margins of a whole suite run, to see how near its bounds each test ends
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(log, "a") as f:
            f.write(f"{test}\tbest {err.min():.4f} <= {best}\tfinal {err[-1]:.4f} <= {final}\n")
    assert err.min() <= best and err[-1] <= final, err


def run_program(n: int, path: Path, args: Sequence[str] = (), timeout: float = 120.0) -> Result:
    """``mpiexec -n N python PATH ARGS`` (a test program of its own) under a hard timeout."""
    cmd = launch.mpi_command(n, [sys.executable, str(path), *args])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    res = launch.run(cmd, timeout, env=env, cwd=ROOT)
    if res.reason:
        raise AssertionError(f"{path.name} on {n} ranks hung for {timeout:.0f} s\n{res.output}")
    return res


def final_weights(run_dir: Path) -> Any:
    """The final model a run's dump holds (``model/weights``)."""
    import h5py

    with h5py.File(Path(run_dir) / "stats.h5", "r") as f:
        return f["model/weights"][:]


def require_gpu() -> None:
    """Skip the calling test (or module fixture) unless CuPy sees a CUDA device."""
    import pytest

    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install failing inside the import
        pytest.skip(f"CuPy cannot be imported: {e}")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device is visible")
    except Exception as e:  # CUDARuntimeError: no driver or no device
        pytest.skip(f"CuPy sees no CUDA device: {e}")


def reseal(ckpt_dir: Path, rank: int) -> None:
    """Record rank ``rank``'s edited file's SHA-256 in ``LATEST``, as a checkpoint written that
    way would have it: the checks behind the manifest's checksum are then what a test reaches."""
    from pserver.ckpt.files import MANIFEST, latest, rank_file, sha256

    body = json.loads((ckpt_dir / MANIFEST).read_text())
    body["sha256"][str(rank)] = sha256(rank_file(ckpt_dir, latest(ckpt_dir).generation, rank))
    (ckpt_dir / MANIFEST).write_text(json.dumps(body))
