"""What the benchmark scripts share (run as ``python scripts/NAME.py``): options, launches,
medians and tables.

* :func:`bench_parser` builds a script's ``argparse`` parser with the common options
  (``--repeats``, ``--json``, ``--timeout``, ``--quiet-idle``/``--quiet-wait``, ``--mpiexec``,
  ``--mpiexec-flags``, ``-v``, ``--pserver-run``, ``--set``); :func:`parse` checks them.
* :class:`Launcher` runs mpiexec jobs through :mod:`pserver.job.launch` (hard timeout, process
  group killed; launcher from ``PSERVER_MPIEXEC`` / ``PSERVER_MPIEXEC_FLAGS`` unless
  ``--mpiexec`` / ``--mpiexec-flags`` say otherwise), waiting for a quiet machine first.
  ``Launcher.worker`` runs the script's own MPI mode and returns the JSON of its ``RESULT``
  line.
* :func:`median`, :func:`table`, :func:`idle_summary` for the printed figures.

A new benchmark (``scripts/`` is on ``sys.path`` when a script there runs)::

    from benchlib import ROOT, RESULT, Launcher, bench_parser, median, parse, pserver_run, table

    p = bench_parser(__doc__, repeats=3, timeout=120.0)  # + the script's own options
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parse(p, argv)
    if args.worker:                         # under mpiexec: rank 0 prints RESULT + json.dumps(...)
        ...
    launcher = Launcher.from_args(__file__, args)
    res = launcher.worker(4, ["--worker"])  # this script on 4 ranks: its RESULT as a dict
    job = launcher.run(5, [*pserver_run(args), str(ROOT / "examples/quickstart.toml"),
                           f"run.out_dir={out}", *args.set])  # a pserver job; raises on failure
    job.seconds, job.stdout                 # pserver.job.launch.Completed
    print(table(["case", "GB/s"], [["a", f"{median(runs):.2f}"]], title="..."))

``Launcher.run(..., check=False)`` returns a failed or killed job instead of raising (its
``reason`` says why it was killed), ``log=PATH`` sends the output to a file, and ``watch=``
(called every 2 s) may stop a job early by returning a reason, e.g. a job whose training ended
but whose ranks do not exit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script belongs to, installed or not
    sys.path.insert(0, str(ROOT))

from pserver.job import launch  # noqa: E402

RESULT = "RESULT "  # prefix of the line a worker rank prints for the driver


# -- options ------------------------------------------------------------------------------------


def bench_parser(
    doc: str | None,
    *,
    repeats: int | None = None,
    timeout: float | None = None,
    quiet_idle: float = 0.8,
    epilog: str | None = None,
    pserver_run: bool = True,
    overrides: bool = True,
    json_out: bool = True,
) -> argparse.ArgumentParser:
    """A parser with the options every benchmark shares; the script adds its own.

    ``doc``: the script's docstring (its first paragraph is the description). ``repeats`` /
    ``timeout``: their defaults, None to leave the option out (no mpiexec, nothing repeated).
    """
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], epilog=epilog)
    if repeats is not None:
        p.add_argument(
            "--repeats", "--repeat", type=int, default=repeats, dest="repeats",
            help="runs of each measurement; medians are printed (default %(default)s)",
        )  # fmt: skip
    if json_out:
        p.add_argument("--json", type=Path, help="also write every figure as JSON to this file")
    if timeout is not None:
        add_launch_args(p, timeout, quiet_idle)
    if pserver_run:
        add_pserver_run_arg(p)
    if overrides:
        p.add_argument(
            "--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
            help="extra pserver-run overrides for every run, e.g. comm.poll_max=1e-4 "
            "(repeatable)",
        )  # fmt: skip
    return p


def add_launch_args(p: argparse.ArgumentParser, timeout: float, quiet_idle: float = 0.8) -> None:
    """The options of a :class:`Launcher`: timeout, quiet machine, launcher, verbosity."""
    p.add_argument("--timeout", type=float, default=timeout, help="seconds per mpiexec launch "
                   "(default %(default)s); past it the whole job is killed")  # fmt: skip
    p.add_argument(
        "--quiet-idle", type=float, default=quiet_idle,
        help="before each launch wait until this fraction of the CPU is idle (0: never wait; "
        "default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--quiet-wait", type=float, default=60.0, help="longest wait for a quiet machine, s"
    )
    p.add_argument(
        "--mpiexec", default=None, help=f"launcher program (default: ${launch.MPIEXEC_VAR}, "
        "else the mpiexec beside this Python, else on PATH)",
    )  # fmt: skip
    p.add_argument(
        "--mpiexec-flags", default=None, metavar="FLAGS",
        help=f"launcher flags, split like a shell line (default: ${launch.FLAGS_VAR})",
    )  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true", help="print every command")


def add_pserver_run_arg(p: argparse.ArgumentParser) -> None:
    """``--pserver-run``: the command that starts one pserver rank (:func:`pserver_run_command`)."""
    p.add_argument(
        "--pserver-run",
        default=pserver_run_command(),
        help="command that runs one pserver rank, split like a shell line "
        "(default: %(default)s)",
    )


#: The data the accuracy drivers (``reproduce_*``) train on by default (issue 25, item 6):
#: Fashion-MNIST, the first ``TRAIN_SAMPLES`` training images (a 2-core machine's time budget)
#: and the full t10k test set; ``--data digits`` is scikit-learn's 8×8 digits of the quickstart.
DATASETS = ("fashion-mnist", "digits")
TRAIN_SAMPLES = 10_000


def add_data_args(
    p: argparse.ArgumentParser, default: str = "fashion-mnist", extra: Sequence[str] = ()
) -> None:
    """``--data`` and ``--train-samples``: what a reproduce driver trains on (``extra``: the
    driver's own data sets, whose overrides it makes itself)."""
    p.add_argument(
        "--data", choices=(*DATASETS, *extra), default=default,
        help="dataset: fashion-mnist (its first --train-samples training images, tested on the "
        "full t10k set) or the quickstart's digits (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--train-samples", type=int, default=TRAIN_SAMPLES,
        help="fashion-mnist: training images kept, 0 for all 60,000 (default: %(default)s)",
    )  # fmt: skip


def data_overrides(args: argparse.Namespace) -> list[str]:
    """The pserver-run overrides of ``--data`` / ``--train-samples``."""
    if args.data == "digits":
        return ["data.source=digits"]
    return ["data.source=fashion-mnist", f"data.train_samples={args.train_samples}"]


def data_label(args: argparse.Namespace) -> str:
    """``Fashion-MNIST (10,000 training images, t10k test set)`` or ``digits``."""
    if args.data == "digits":
        return "digits (8×8, quickstart split)"
    kept = f"{args.train_samples:,}" if args.train_samples else "all 60,000"
    return f"Fashion-MNIST ({kept} training images, t10k test set)"


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``p.parse_args(argv)`` with the common options checked (one ``error:`` line, exit 2)."""
    args = p.parse_args(argv)
    repeats = getattr(args, "repeats", 1)  # None: the script fills in its own default
    if repeats is not None and repeats < 1:
        p.error("--repeats must be >= 1")
    if getattr(args, "timeout", 1.0) <= 0:
        p.error("--timeout must be > 0")
    if getattr(args, "train_samples", 0) < 0:
        p.error("--train-samples must be >= 0 (0: all)")
    if getattr(args, "mpiexec_flags", None) is not None:
        try:
            args.mpiexec_flags = shlex.split(args.mpiexec_flags)
        except ValueError as e:
            p.error(f"--mpiexec-flags: {e}")
    return args


def default_tool(name: str) -> str:
    """``name`` next to this Python (the .venv's tools), else on PATH, else the bare name."""
    sibling = Path(sys.executable).with_name(name)
    return str(sibling) if sibling.exists() else (shutil.which(name) or name)


def pserver_run_command() -> str:
    """How to start one pserver rank: the ``pserver-run`` beside this Python or on PATH, else
    this Python running ``pserver.job.cli`` (a checkout that is not installed, e.g. on a lent GPU
    machine with PYTHONPATH pointing at it). A shell line: split it with ``shlex.split``."""
    found = default_tool("pserver-run")
    if Path(found).is_file():
        return found
    return shlex.join(launch.pserver_cli())


def pserver_run(args: argparse.Namespace) -> list[str]:
    """``--pserver-run`` as an argument list."""
    return shlex.split(args.pserver_run)


# -- launching ----------------------------------------------------------------------------------


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


def bench_env() -> dict[str, str]:
    """This environment with one BLAS thread per rank and this Python's bin first on PATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class Launcher:
    """Runs mpiexec jobs with :func:`pserver.job.launch.run`: a hard timeout kills the whole job.

    Before each launch it waits (up to ``quiet_wait`` s) for the machine to be at least
    ``quiet_idle`` idle, since other people's jobs on a 2-core machine swamp any figure; the
    idle fraction seen before each launch is kept in ``idle_seen``. Every job gets one BLAS
    thread per rank. ``script`` is the benchmark whose worker modes :meth:`worker` runs.
    """

    def __init__(
        self,
        script: str,
        timeout: float,
        *,
        mpiexec: str | None = None,
        flags: Sequence[str] | None = None,
        verbose: bool = False,
        quiet_idle: float = 0.0,
        quiet_wait: float = 60.0,
        cwd: Path | None = None,
    ) -> None:
        self.script = str(Path(script).resolve())
        self.launch = launch.launcher(program=mpiexec, flags=flags)
        self.timeout, self.verbose, self.cwd = timeout, verbose, cwd
        self.quiet_idle, self.quiet_wait = quiet_idle, quiet_wait
        self.env = bench_env()
        self.idle_seen: list[float] = []

    @classmethod
    def from_args(cls, script: str, args: argparse.Namespace, **kw: Any) -> Launcher:
        """A launcher with the options of :func:`add_launch_args`."""
        return cls(
            script, args.timeout, mpiexec=args.mpiexec, flags=args.mpiexec_flags,
            verbose=args.verbose, quiet_idle=args.quiet_idle, quiet_wait=args.quiet_wait, **kw,
        )  # fmt: skip

    def wait_quiet(self) -> None:
        self.idle_seen.append(wait_for_quiet(self.quiet_idle, self.quiet_wait))

    def run(
        self,
        n: int,
        args: list[str],
        *,
        log: Path | None = None,
        watch: Callable[[], str | None] | None = None,
        check: bool = True,
    ) -> launch.Completed:
        """``mpiexec -n N ARGS`` after a quiet-machine wait; with ``check`` a failure or a kill
        raises (:class:`pserver.job.launch.LaunchError`, a RuntimeError)."""
        cmd = launch.mpi_command(n, args, self.launch)
        self.wait_quiet()
        if self.verbose:
            print("  $", shlex.join(cmd), file=sys.stderr, flush=True)
        res = launch.run(cmd, self.timeout, env=self.env, cwd=self.cwd, log=log, watch=watch)
        return res.check() if check else res

    def worker(self, n: int, args: list[str]) -> dict[str, Any]:
        """Run the script's worker mode on ``n`` ranks; the JSON its RESULT line carries."""
        return result_of(self.run(n, [sys.executable, self.script, *args]).stdout, args)


def result_of(output: str, what: object) -> dict[str, Any]:
    """The JSON of the last ``RESULT`` line of a worker's output."""
    lines = [ln for ln in output.splitlines() if ln.startswith(RESULT)]
    if not lines:
        raise RuntimeError(f"no result from {what}:\n{output[-2000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def gpu_missing() -> str:
    """Why a GPU benchmark cannot run here ("" when CuPy sees a CUDA device)."""
    try:
        import cupy

        return "" if cupy.cuda.runtime.getDeviceCount() > 0 else "no CUDA device is visible"
    except Exception as e:  # ImportError, or CUDARuntimeError without a driver
        return f"CuPy or a CUDA device is missing ({e})"


# -- figures ------------------------------------------------------------------------------------


def median(values: Iterable[float], *, drop_nan: bool = False) -> float:
    """The median; NaN when there is nothing (after dropping NaNs, with ``drop_nan``)."""
    vals = [v for v in values if not (drop_nan and math.isnan(v))]
    return statistics.median(vals) if vals else math.nan


def idle_summary(seen: Sequence[float]) -> str:
    """``CPU idle before launches: min X %, median Y %`` ("" when nothing was launched)."""
    if not seen:
        return ""
    return f"CPU idle before launches: min {min(seen):.0%}, median {median(seen):.0%}"


def table(
    header: Sequence[str], rows: Sequence[Sequence[object]], title: str = "", sep: str = "  "
) -> str:
    """Columns as wide as their widest cell, the first left-aligned and the others
    right-aligned, a rule under the header; ``title`` (if any) on the line above."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    rule = sep.join("-" * w for w in widths)

    def line(row: list[str]) -> str:
        return sep.join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True)))  # fmt: skip

    return "\n".join([*([title] if title else []), line(cells[0]), rule, *map(line, cells[1:])])


def write_json(path: Path | None, doc: Any, indent: int = 2) -> None:
    """Write ``doc`` to ``path`` (nothing when ``path`` is None); floats for numpy scalars."""
    if path is not None:
        Path(path).write_text(json.dumps(doc, indent=indent, default=float) + "\n")
