"""The MPICH segment names of a SLURM job step, and their exact removal (pserver.job.mpich_shm)."""

from __future__ import annotations

from pserver.job.mpich_shm import fnv1a, remove_stale, segment_names


def test_names_follow_mpich_fnv1a_of_job_dot_step():
    assert fnv1a("") == 2166136261
    # seen in /dev/shm under SLURM 22.05 --mpi=pmi2 with MPICH 5.0.2: job 2, step 1, node 0
    assert "mpich_shm_271e0d30_0" in segment_names("2", steps=2, nodes=1)
    assert "mpich_shm_c141a9dc_0" in segment_names("3", steps=1, nodes=1)  # job 3, step 0


def test_only_this_jobs_files_are_removed(tmp_path):
    mine = segment_names("3", steps=1, nodes=1)[0]
    others = ["mpich_shm_271e0d30_0", "mpich_shm_deadbeef_0", "unrelated3"]
    for name in [mine, *others]:
        (tmp_path / name).write_bytes(b"")
    assert remove_stale("3", tmp_path, steps=4, nodes=2) == [mine]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
