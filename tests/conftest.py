"""Shared test set-up: ``tests/`` on the path, and the ``mpi`` mark enforced.

A test that starts an MPI launcher (``mpiexec``, ``mpirun``, ``srun`` or the program
``$PSERVER_MPIEXEC`` names) must carry ``@pytest.mark.mpi`` (or ``slurm``: a job under a real
SLURM), so ``-m mpi`` / ``-m "not mpi and not slurm"`` split the suite truthfully: an unmarked
test that launches a job fails with the reason.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pserver.runtime.session import OPEN_MPI_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A test that imports mpi4py.MPI in this process (a role's module, MPI's library string)
# initialises a singleton MPI; under Open MPI its libfabric BTL probes for about a second
# (docs/performance.md, *Open MPI and MPICH*). The same default the ranks take
# (pserver.runtime.session.mpi_defaults; MPICH ignores it); the jobs launched inherit it.
for _key, _value in OPEN_MPI_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

pytest_plugins = ["pytester"]

LAUNCHERS = {"mpiexec", "mpirun", "srun", "mpiexec.hydra", "orterun", "prterun"}


def _launcher_names() -> set[str]:
    named = os.environ.get("PSERVER_MPIEXEC", "").strip()
    return LAUNCHERS | ({os.path.basename(named)} if named else set())


def _exists(program: str) -> bool:
    return shutil.which(program) is not None or os.path.exists(program)


@pytest.fixture(autouse=True)
def _jobs_carry_the_mpi_mark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    if request.node.get_closest_marker("mpi") or request.node.get_closest_marker("slurm"):
        yield
        return
    real = subprocess.Popen
    names = _launcher_names()

    class Guarded(real):  # a subclass, so isinstance checks and subprocess.run keep working
        def __init__(self, args, *a, **kw):
            argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
            head = os.path.basename(str(argv[0])) if argv else ""
            if head in names and _exists(str(argv[0])):  # a missing one launches nothing
                raise AssertionError(
                    f"{request.node.nodeid} launches {head} without @pytest.mark.mpi"
                )
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Guarded)
    yield
