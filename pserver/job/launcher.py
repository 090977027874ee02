"""``pserver-launch CONFIG --learners N [section.key=value …]``: a job without rank arithmetic.

The world size follows from the strategy and the layout (:func:`pserver.plan.topology.world_size`:
shards, statistics and data servers, aggregators and λ learners), so the user names λ only.
The job is started by

* the launcher ``$PSERVER_MPIEXEC`` names (with ``$PSERVER_MPIEXEC_FLAGS``), when set;
* else ``srun`` inside a SLURM allocation (``$SLURM_JOB_ID`` set; ``--mpi=pmi2`` for MPICH,
  ``--mpi=pmix`` for Open MPI, as ``scripts/pserver.slurm`` does);
* else the ``mpiexec`` beside this Python (:func:`pserver.job.launch.launcher`).

Every rank runs this Python's ``-m pserver.job.cli``: the same environment as the launcher's.
The job runs in a process group of its own. SIGINT and SIGTERM are passed on to that group (under
``srun`` through ``scancel --signal``: :func:`signaller`), so every rank checkpoints and the run
exits 75 (docs/checkpoints.md); ``--grace`` seconds later, or at a second signal, the group is
killed. Past ``--timeout`` the job gets SIGTERM the same way.
The output streams through; the exit status is the job's (128 + n for a job killed by signal
n, 124 for one killed past its timeout). Bad input is one ``pserver-launch: error:`` line and
exit 2, before anything is started.

The same plan and executor serve the Python API (:mod:`pserver.job.api`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pserver.errors import ConfigError, PserverError
from pserver.job import launch
from pserver.plan.config import Config, load_config
from pserver.plan.topology import world_size
from pserver.runtime.rundir import RUN_ID_VAR, expand, run_id

PROG = "pserver-launch"
GRACE = 60.0  # seconds a signalled job has to checkpoint and exit before it is killed
TIMED_OUT = 124  # the exit status of a job killed past its timeout, as timeout(1) gives
POLL = 1.0  # seconds between looks at the deadlines (Popen.wait sleeps meanwhile)
FORWARDED = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Plan:
    """One launch: the command, its environment and where the run will write."""

    cfg: Config
    size: int
    cmd: list[str]
    env: dict[str, str]
    run_dir: Path
    signaller: list[str] | None = None  # how a signal reaches the ranks (None: their group)

    @property
    def command(self) -> str:
        return shlex.join(self.cmd)


@dataclass
class Outcome:
    """How a job ended: its exit status; why it was stopped (``stopped``: "timed out after
    …", "got SIGINT"; empty when it ended by itself), whether it then had to be killed, and the
    signal this process got and passed on (None when none came)."""

    returncode: int
    stopped: list[str] = field(default_factory=list)
    killed: bool = False
    signalled: int | None = None
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        """"" for a job that ended by itself, else why it was stopped (and killed)."""
        return "; ".join([*self.stopped, *(["killed"] if self.killed else [])])

    @property
    def timed_out(self) -> bool:
        return bool(self.stopped) and self.stopped[0].startswith("timed out")


def resolve(
    config: str | Path,
    learners: int | None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    rid: str | None = None,
) -> Plan:
    """The plan of ``config`` with ``overrides`` on ``learners`` learners (None: the config's
    ``cluster.learners``). ``rid``: the run id (default: :func:`pserver.runtime.rundir.run_id`
    of ``environ``), handed to every rank through ``$PSERVER_RUN_ID`` so that the run
    directory is known here. Bad input raises :class:`~pserver.errors.PserverError`."""
    env = dict(os.environ if environ is None else environ)
    given = [*overrides, *([f"cluster.learners={learners}"] if learners is not None else [])]
    if learners is not None and learners < 1:
        raise ConfigError(f"--learners {learners}: expected λ >= 1")
    with warnings.catch_warnings():  # the job itself says once what it ignores
        warnings.simplefilter("ignore")
        cfg = load_config(config, given)
    if cfg.cluster.learners < 1:
        raise ConfigError(
            f"{config}: cluster.learners is 0 (every rank left a learner): say how many with "
            "--learners N"
        )
    n = world_size(cfg)
    env[RUN_ID_VAR] = rid or run_id(env)
    env.setdefault("PYTHONUNBUFFERED", "1")  # progress lines as they come, not at the end
    out, _ = expand(cfg.run.out_dir, cfg.run.name, env[RUN_ID_VAR])
    head = prefix(n, env)
    cmd = [*head, *launch.pserver_cli(), str(config), *given]
    return Plan(cfg, n, cmd, env, Path(out), signaller(head, env))


def prefix(n: int, environ: Mapping[str, str]) -> list[str]:
    """The launcher's part of the command for ``n`` ranks (module docstring: which one)."""
    if environ.get(launch.MPIEXEC_VAR, "").strip() or not environ.get("SLURM_JOB_ID"):
        return launch.mpi_command(n, [], launch.launcher(environ))
    return ["srun", f"--mpi={'pmix' if is_openmpi() else 'pmi2'}", "-n", str(n)]


def signaller(head: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """How to pass a signal to the ranks: under ``srun`` through slurmd (``scancel
    --signal=SIG JOB``, ``{sig}`` the signal's name), because ``srun`` itself ends its tasks
    with SIGKILL when it gets SIGTERM, so no rank could checkpoint (``scripts/pserver.slurm``
    does the same); None elsewhere: the job's process group gets the signal directly."""
    if head[0] != "srun":
        return None
    return ["scancel", "--signal={sig}", environ["SLURM_JOB_ID"]]


def is_openmpi() -> bool:
    """Whether mpi4py's library is Open MPI, asked without initializing MPI."""
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    return "Open MPI" in MPI.Get_library_version()


def execute(
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    grace: float = GRACE,
    log: str | Path | None = None,
    signaller: Sequence[str] | None = None,
) -> Outcome:
    """Run ``cmd`` in its own process group until it ends (module docstring: signals, timeout).

    Output goes to this process's stdout and stderr, or with ``log`` to that file after a first
    line ``$ COMMAND`` (stderr merged). Signals are passed on only from the main thread (the
    only one Python lets handle them); elsewhere only the timeout stops the job.
    """
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        sink = None
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            sink = stack.enter_context(open(log, "w"))
            sink.write(f"$ {shlex.join(cmd)}\n")
            sink.flush()
        try:
            proc = subprocess.Popen(
                list(cmd), env=None if env is None else dict(env), stdout=sink,
                stderr=subprocess.STDOUT if sink else None,
                start_new_session=True,  # one group: a signal or a kill reaches every rank
            )  # fmt: skip
        except OSError as e:
            why = f"cannot start {cmd[0]!r} ({e}); set {launch.MPIEXEC_VAR}?"
            raise launch.LaunchError(why) from None
        guard = Guard(proc, grace, signaller)
        stack.enter_context(guard.forwarding())
        stack.callback(guard.reap)  # whatever goes wrong here, the job does not outlive it
        guard.wait(None if timeout is None else t0 + timeout, timeout)
    out = guard.outcome
    out.seconds = time.monotonic() - t0
    return out


class Guard:
    """Passes signals on to a job's process group and kills it when it outlives its grace."""

    def __init__(
        self, proc: subprocess.Popen, grace: float, signaller: Sequence[str] | None = None
    ) -> None:
        self.proc, self.grace, self.signaller = proc, grace, signaller
        self.kill_at: float | None = None  # once a signal was passed on: when to kill
        self.outcome = Outcome(0)

    @contextlib.contextmanager
    def forwarding(self) -> Iterator[None]:
        """Our SIGINT/SIGTERM handlers while the job runs (main thread only), then the old."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.on_signal) for s in FORWARDED}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    def on_signal(self, signum: int, _frame: object) -> None:
        if self.outcome.signalled is not None:  # a second signal: no more waiting
            self.kill()
            return
        self.outcome.signalled = signum
        self.stop(signum, f"got {signal.Signals(signum).name}")

    def stop(self, signum: int, why: str) -> None:
        """Pass ``signum`` to every process of the job; kill them ``grace`` s later."""
        name = signal.Signals(signum).name
        print(f"{PROG}: {why}: passing {name} to the job (killed in {self.grace:g} s if still "
              "running)", file=sys.stderr, flush=True)  # fmt: skip
        self.outcome.stopped.append(why)
        self.kill_at = time.monotonic() + self.grace
        if self.signaller and self.signal_through(name):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def signal_through(self, name: str) -> bool:
        """``signaller`` with the signal's name (``TERM``) for ``{sig}``; whether it worked."""
        cmd = [a.replace("{sig}", name.removeprefix("SIG")) for a in self.signaller]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def reap(self) -> None:
        """Kill the job if it still runs (an exception left :meth:`wait`), and wait for it."""
        if self.proc.poll() is None:
            self.kill()
            self.proc.wait()

    def kill(self) -> None:
        self.outcome.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, deadline: float | None, timeout: float | None) -> None:
        """Until the job ended; SIGTERM past ``deadline``, SIGKILL past the grace after it."""
        while True:
            try:
                rc = self.proc.wait(timeout=POLL)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if self.kill_at is not None and now >= self.kill_at:
                    self.kill()
                elif deadline is not None and now >= deadline and self.kill_at is None:
                    self.stop(signal.SIGTERM, f"timed out after {timeout:g} s")
        out = self.outcome
        out.returncode = TIMED_OUT if out.killed and out.timed_out else status(rc)


def status(rc: int) -> int:
    """A child's exit status as a shell gives it: 128 + n for a child ended by signal n."""
    return 128 - rc if rc < 0 else rc


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].strip("`"))
    p.add_argument("config", help="the run config (TOML)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.add_argument("--learners", "-l", type=int, metavar="N",
                   help="λ, the number of learners (default: the config's cluster.learners)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="stop the job after S seconds (SIGTERM, then SIGKILL after --grace)")
    p.add_argument("--grace", type=float, default=GRACE, metavar="S",
                   help=f"seconds a stopped job has to checkpoint before it is killed ({GRACE:g})")
    p.add_argument("--print-command", action="store_true",
                   help="print the command and the run directory, start nothing")
    p.add_argument("--np-only", action="store_true", help="print the world size only")
    return p.parse_intermixed_args(argv)  # overrides before and after the options


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pserver-launch``; the job's exit status (module docstring)."""
    args = parse_args(argv)
    try:
        if args.timeout is not None and args.timeout <= 0:
            raise ConfigError(f"--timeout {args.timeout:g}: expected seconds > 0")
        plan = resolve(args.config, args.learners, args.overrides)
    except (PserverError, launch.LaunchError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.np_only or args.print_command:
        print(plan.size if args.np_only else f"{plan.command}\n# run directory {plan.run_dir}")
        return 0
    print(f"{PROG}: {plan.size} ranks ({plan.cfg.cluster.learners} learners, protocol "
          f"{plan.cfg.protocol.name}); run directory {plan.run_dir}\n$ {plan.command}",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        out = execute(plan.cmd, plan.env, args.timeout, args.grace, signaller=plan.signaller)
    except launch.LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if out.reason:
        print(f"{PROG}: {out.reason}; exit status {out.returncode}", file=sys.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
