"""MPICH's shared-memory files of a SLURM job, and their removal before a requeued attempt.

MPICH (4.x, 5.x: ``ch4/shm/posix``) puts each node's intra-node segment in
``/dev/shm/mpich_shm_<world>_<node>`` (and ``mpich_vci_<world>_<node>``), where ``<world>`` is the
32-bit FNV-1a hash, in hex, of the PMI job name, which SLURM's ``--mpi=pmi2`` sets to
``<job id>.<step id>``, and ``<node>`` the node's index in the step. The first process of a node
creates the file with ``O_EXCL`` and the others attach and wait for it to say "ready"; a clean
``MPI_Finalize`` unlinks it. A step that is killed (``scancel``, a time limit, ``scontrol
requeue``, a preemption) leaves the file behind, and a requeued job gets the same job id and
counts its steps from 0 again: its ranks then attach to the dead step's segment and wait in
``MPI_Init`` forever (seen with the PyPI MPICH 5.0.2 under SLURM 22.05). Hydra's ``mpiexec``
names its job after its own PID, so it does not collide.

``python -m pserver.job.mpich_shm JOBID`` removes, on the node it runs on, the files of steps
``0 .. STEPS-1`` of job JOBID, nodes ``0 .. NODES-1``: ``scripts/pserver.slurm`` runs it on every
node of the allocation before it launches. Only exact names are removed, never a pattern:
other jobs' files (other users', other steps') are left alone.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

SHM = Path("/dev/shm")
STEPS = 64  # steps of one job whose files are looked for (the batch script runs two or three)
NODES = 256  # node indices looked for


def fnv1a(text: str) -> int:
    """32-bit FNV-1a of ``text``'s bytes (uthash's ``HASH_FNV``, which MPICH uses)."""
    h = 2166136261
    for byte in text.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def segment_names(job: str, steps: int = STEPS, nodes: int = NODES) -> list[str]:
    """The file names MPICH gives the segments of ``job``'s steps under ``--mpi=pmi2``."""
    out = []
    for step in range(steps):
        world = f"{fnv1a(f'{job}.{step}'):x}"
        out += [f"mpich_{kind}_{world}_{n}" for n in range(nodes) for kind in ("shm", "vci")]
    return out


def remove_stale(job: str, where: Path = SHM, steps: int = STEPS, nodes: int = NODES) -> list[str]:
    """Remove the segments of ``job`` found in ``where`` (this node); the names removed."""
    removed = []
    present = set(os.listdir(where)) if where.is_dir() else set()
    for name in segment_names(job, steps, nodes):
        if name in present:
            try:
                (where / name).unlink()
                removed.append(name)
            except FileNotFoundError:  # another rank of this node was first
                pass
    return removed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pserver.job.mpich_shm",
        description="Remove the MPICH shared-memory files a killed attempt of a SLURM job left.",
    )
    p.add_argument("job", help="the SLURM job id ($SLURM_JOB_ID)")
    p.add_argument("--dir", default=str(SHM), help="where the segments live (default /dev/shm)")
    args = p.parse_args(argv)
    for name in remove_stale(args.job, Path(args.dir)):
        print(f"pserver.job.mpich_shm: removed {args.dir}/{name}, left by a killed step of job "
              f"{args.job}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
