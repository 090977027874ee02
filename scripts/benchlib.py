"""Helpers shared by the benchmark scripts (run as ``python scripts/NAME.py``)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULT = "RESULT "  # prefix of the line a worker rank prints for the driver


def cpu_idle(seconds: float = 1.0) -> float:
    """Fraction of all cores idle over ``seconds`` (from /proc/stat; 1.0 where there is none)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return 1.0
    return (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_quiet(quiet_idle: float, quiet_wait: float) -> float:
    """Wait (up to ``quiet_wait`` s) until the CPUs are ``quiet_idle`` idle; the idle share seen.

    Other people's jobs on a 2-core machine swamp any figure. With ``quiet_idle <= 0`` nothing
    is awaited, but the load the run starts under is still measured (0.5 s) and returned.
    """
    if quiet_idle <= 0:
        return cpu_idle(0.5)
    deadline = time.monotonic() + quiet_wait
    while (idle := cpu_idle()) < quiet_idle and time.monotonic() < deadline:
        pass
    if idle < quiet_idle:
        print(f"  warning: machine only {idle:.0%} idle; measuring anyway", file=sys.stderr)
    return idle


def default_tool(name: str) -> str:
    """``name`` next to this Python (the .venv's mpiexec), else on PATH."""
    sibling = Path(sys.executable).with_name(name)
    return str(sibling) if sibling.exists() else (shutil.which(name) or name)


def pserver_run_command() -> str:
    """How to start one pserver rank: the ``pserver-run`` beside this Python or on PATH, else
    this Python running ``pserver.cli`` (a checkout that is not installed, e.g. on a lent GPU
    machine with PYTHONPATH pointing at it). A shell line: split it with ``shlex.split``."""
    found = default_tool("pserver-run")
    if Path(found).is_file():
        return found
    return f"{shlex.quote(sys.executable)} -m pserver.cli"


def add_pserver_run_arg(p: argparse.ArgumentParser) -> None:
    """``--pserver-run``: the command that starts one pserver rank (:func:`pserver_run_command`)."""
    p.add_argument(
        "--pserver-run",
        default=pserver_run_command(),
        help="command that runs one pserver rank, split like a shell line "
        "(default: %(default)s)",
    )


def gpu_missing() -> str:
    """Why a GPU benchmark cannot run here ("" when CuPy sees a CUDA device)."""
    try:
        import cupy

        return "" if cupy.cuda.runtime.getDeviceCount() > 0 else "no CUDA device is visible"
    except Exception as e:  # ImportError, or CUDARuntimeError without a driver
        return f"CuPy or a CUDA device is missing ({e})"


class Launcher:
    """Runs mpiexec jobs under a timeout, killing the whole process group when it expires.

    Before each launch it waits (up to ``quiet_wait`` s) for the machine to be at least
    ``quiet_idle`` idle, since other people's jobs on a 2-core machine swamp any figure; the
    idle fraction seen before each launch is kept in ``idle_seen``. Every job gets one BLAS
    thread per rank. ``script`` is the benchmark whose ``worker`` modes run under mpiexec.
    """

    def __init__(
        self,
        script: str,
        mpiexec: str,
        timeout: float,
        verbose: bool,
        quiet_idle: float,
        quiet_wait: float,
    ) -> None:
        self.script = str(Path(script).resolve())
        self.mpiexec, self.timeout, self.verbose = mpiexec, timeout, verbose
        self.quiet_idle, self.quiet_wait = quiet_idle, quiet_wait
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self.env["MKL_NUM_THREADS"] = "1"
        self.idle_seen: list[float] = []

    def wait_quiet(self) -> None:
        self.idle_seen.append(wait_for_quiet(self.quiet_idle, self.quiet_wait))

    def run(self, n: int, args: list[str]) -> str:
        """``mpiexec -n N ARGS``; its stdout, or RuntimeError on a timeout or a failure."""
        cmd = [self.mpiexec, "-n", str(n), *args]
        self.wait_quiet()
        if self.verbose:
            print("  $", " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=self.env, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"timed out after {self.timeout:.0f} s: {' '.join(cmd)}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{err[-3000:]}")
        return out

    def worker(self, n: int, args: list[str]) -> dict[str, Any]:
        """Run the script's worker mode on ``n`` ranks; the JSON its RESULT line carries."""
        out = self.run(n, [sys.executable, self.script, *args])
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
        if not lines:
            raise RuntimeError(f"no result from {args}:\n{out[-2000:]}")
        return json.loads(lines[-1][len(RESULT) :])


def add_launch_args(p: argparse.ArgumentParser, timeout: float) -> None:
    """The options of a :class:`Launcher`: timeout, quiet machine, mpiexec, verbosity."""
    p.add_argument("--timeout", type=float, default=timeout, help="seconds per mpiexec launch")
    p.add_argument(
        "--quiet-idle",
        type=float,
        default=0.8,
        help="before each launch wait until this fraction of the CPU is idle (0: never wait)",
    )
    p.add_argument(
        "--quiet-wait", type=float, default=60.0, help="longest wait for a quiet machine, s"
    )
    p.add_argument("--mpiexec", default=default_tool("mpiexec"), help="mpiexec to launch with")
    p.add_argument("-v", "--verbose", action="store_true", help="print every command")
