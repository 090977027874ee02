"""srun without --mpi (or a launcher of another MPI): N worlds of size 1, said once."""

from __future__ import annotations

from pserver.job.launchcheck import lone_rank


def srun(rank: int, tasks: int = 7) -> dict[str, str]:
    return {"SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_PROCID": str(rank), "SLURM_NTASKS": "7"}


def test_srun_without_pmi_is_named_once_with_the_fix():
    said = [lone_rank(1, srun(r)) for r in range(7)]
    assert all(s is not None for s in said)
    assert [s[1] for s in said] == [True] + [False] * 6  # only the launcher's rank 0 speaks
    line = said[0][0]
    assert "srun started 7 processes" in line and "srun --mpi=pmi2" in line


def test_a_right_launch_or_a_single_task_is_not_a_mistake():
    assert lone_rank(7, srun(3)) is None  # MPI saw the whole world
    assert lone_rank(1, srun(0, tasks=1)) is None  # one task: the usual checks say the rest
    assert lone_rank(1, {}) is None


def test_open_mpi_launcher_with_another_library_is_named():
    env = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}
    line, speaks = lone_rank(1, env)
    assert "Open MPI's mpirun started 4 processes" in line and not speaks
