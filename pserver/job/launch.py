"""Start ``mpiexec`` jobs under a hard timeout; past it the job's whole process group is killed.

The one place that knows how a job is launched: the tests (``tests/mpirun.py``) and every
benchmark under ``scripts/`` (``scripts/benchlib.py``) go through it. It only builds command
lines and runs subprocesses: no mpi4py, nothing from ``pserver.comm`` or ``pserver.roles``.

The launcher is read from the environment, so the same tests and benchmarks run under another
MPI without editing them:

``PSERVER_MPIEXEC``
    the launcher program, a path or a name looked up on PATH (not split: a path may hold
    spaces). Unset or empty: the ``mpiexec`` beside this Python (the .venv's MPICH, see
    ``scripts/setup.sh``), else the first ``mpiexec`` on PATH.
``PSERVER_MPIEXEC_FLAGS``
    extra launcher flags, split like a shell line (``shlex.split``) and placed before ``-n``,
    e.g. ``--oversubscribe --allow-run-as-root`` for Open MPI. Unset or empty: none.

Usage::

    from pserver.job import launch

    cmd = launch.mpi_command(4, [*launch.pserver_cli(), "examples/quickstart.toml"])
    job = launch.run(cmd, timeout=120)   # returns for a failing or a hung job too
    job.returncode, job.stdout, job.stderr, job.seconds, job.timed_out, job.reason
    job.check()                          # raises LaunchError (JobKilled if killed) unless exit 0

``run`` starts the command in a new session, i.e. its own process group. When ``timeout``
seconds have passed, or when ``watch()`` (asked every ``poll`` seconds) names a reason, the
group gets SIGKILL: mpiexec, its proxies and every rank, so no orphaned rank keeps a core.
Liveness: every wait in ``run`` is bounded (``communicate`` with a timeout; after the kill, a
bounded ``KILL_GRACE`` for the pipes to close), so ``run`` itself returns within about
``timeout + KILL_GRACE`` seconds whatever the job does.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

MPIEXEC_VAR = "PSERVER_MPIEXEC"
FLAGS_VAR = "PSERVER_MPIEXEC_FLAGS"
KILL_GRACE = 10.0  # seconds to collect the output of a killed job (its pipes close on the kill)


class LaunchError(RuntimeError):
    """A job that could not start, failed, or was killed; the message says which and how."""


class JobKilled(LaunchError):
    """A job killed by ``run``: past its timeout, or stopped early by its ``watch``."""


def default_mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the .venv's MPICH), else the first one on PATH."""
    sibling = Path(sys.executable).parent / "mpiexec"
    found = str(sibling) if sibling.exists() else shutil.which("mpiexec")
    if not found:
        raise LaunchError(
            f"mpiexec not found beside {sys.executable} nor on PATH: run scripts/setup.sh "
            f"(pip install mpich) or set {MPIEXEC_VAR}"
        )
    return found


def mpiexec_program(environ: Mapping[str, str] | None = None) -> str:
    """The launcher program: ``$PSERVER_MPIEXEC`` when set and not blank, else the default."""
    env = os.environ if environ is None else environ
    return env.get(MPIEXEC_VAR, "").strip() or default_mpiexec()


def launcher_flags(environ: Mapping[str, str] | None = None) -> list[str]:
    """``$PSERVER_MPIEXEC_FLAGS`` split like a shell line; [] when unset."""
    env = os.environ if environ is None else environ
    text = env.get(FLAGS_VAR, "")
    try:
        return shlex.split(text)
    except ValueError as e:  # an unbalanced quote
        raise LaunchError(f"{FLAGS_VAR}={text!r} does not split like a shell line: {e}") from None


def launcher(
    environ: Mapping[str, str] | None = None,
    program: str | None = None,
    flags: Sequence[str] | None = None,
) -> list[str]:
    """``[program, *flags]``; each part the environment's (above) unless given here."""
    head = program or mpiexec_program(environ)
    return [head, *(launcher_flags(environ) if flags is None else flags)]


def mpi_command(n: int, args: Sequence[str], launch: Sequence[str] | None = None) -> list[str]:
    """``[*launch, "-n", n, *args]``: ``args`` on ``n`` ranks (``launch``: :func:`launcher`)."""
    if n < 1:
        raise LaunchError(f"a job needs at least one rank, not {n}")
    return [*(launcher() if launch is None else launch), "-n", str(n), *args]


def pserver_cli() -> list[str]:
    """One pserver rank run by this Python, installed or not: ``python -m pserver.job.cli``."""
    return [sys.executable, "-m", "pserver.job.cli"]


@dataclass
class Completed:
    """What one job did. ``reason`` says why ``run`` killed it ("" when it ended by itself)."""

    returncode: int
    stdout: str
    stderr: str
    cmd: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    reason: str = ""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def command(self) -> str:
        return shlex.join(self.cmd)

    def check(self) -> Completed:
        """Itself when the job exited 0; otherwise :class:`LaunchError` with the output's tail."""
        if self.reason:
            raise JobKilled(f"{self.reason}: {self.command}")
        if self.returncode != 0:
            raise LaunchError(f"exit {self.returncode}: {self.command}\n{self.output[-3000:]}")
        return self


def run(
    cmd: Sequence[str],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log: str | Path | None = None,
    watch: Callable[[], str | None] | None = None,
    poll: float = 2.0,
) -> Completed:
    """Run ``cmd`` in its own process group; kill the group past ``timeout`` s or on ``watch``.

    Output is captured (``stdout``, ``stderr``), or, with ``log``, written to that file after a
    first line ``$ COMMAND`` (stderr merged) and read back into ``stdout``. ``env`` is the
    whole environment of the job (None: this process's). ``watch`` is asked every ``poll``
    seconds; a string it returns is the reason to kill the job now.
    """
    t0 = time.monotonic()
    sink = None
    if log is not None:
        sink = open(log, "w")  # closed below, once the job is over
        sink.write(f"$ {shlex.join(cmd)}\n")
        sink.flush()
    try:
        proc = _start(cmd, env, cwd, sink)
        out, err, reason = _wait(proc, t0 + timeout, timeout, watch, poll)
    finally:
        if sink is not None:
            sink.close()
    if log is not None:
        out, err = Path(log).read_text(errors="replace"), ""
    return Completed(
        proc.returncode, out or "", err or "", list(cmd), time.monotonic() - t0,
        reason.startswith("timed out"), reason,
    )  # fmt: skip


def _start(
    cmd: Sequence[str], env: Mapping[str, str] | None, cwd: str | Path | None, sink: IO[str] | None
) -> subprocess.Popen:
    pipe = subprocess.PIPE
    try:
        return subprocess.Popen(
            list(cmd), cwd=cwd, env=None if env is None else dict(env), text=True,
            stdout=sink or pipe, stderr=subprocess.STDOUT if sink else pipe,
            start_new_session=True,  # its own process group: one killpg reaches every rank
        )  # fmt: skip
    except OSError as e:  # FileNotFoundError / PermissionError of the launcher itself
        raise LaunchError(f"cannot start {cmd[0]!r} ({e}); set {MPIEXEC_VAR}?") from None


def _wait(
    proc: subprocess.Popen,
    deadline: float,
    timeout: float,
    watch: Callable[[], str | None] | None,
    poll: float,
) -> tuple[str | None, str | None, str]:
    """(stdout, stderr, why it was killed or "") once the job ended or was killed."""
    while True:
        left = max(0.0, deadline - time.monotonic())
        try:
            out, err = proc.communicate(timeout=min(left, poll) if watch else left)
            return out, err, ""
        except subprocess.TimeoutExpired:
            # communicate may be called again after a timeout: no output is lost
            if time.monotonic() >= deadline:
                reason = f"timed out after {timeout:g} s"
            else:
                reason = (watch() if watch else None) or ""
            if reason:
                return (*kill_group(proc), reason)


def kill_group(proc: subprocess.Popen) -> tuple[str | None, str | None]:
    """SIGKILL the process group ``proc`` leads; what it had written (bounded wait)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # every member already gone
        pass
    try:
        return proc.communicate(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:  # a process that left the group still holds a pipe
        proc.kill()
        proc.wait()
        return None, None
