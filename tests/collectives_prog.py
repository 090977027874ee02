"""Checks of :mod:`pserver.comm.collectives` on every rank of an mpiexec job (run by
tests/test_mpi_collectives.py); prints ``collectives ok`` per rank, raises on a wrong sum.

Arrays hold small integers, so every sum is exact in float32 and float64 whatever order MPI
adds in, and is compared for equality with numpy's sum of the ranks' arrays.
"""

from __future__ import annotations

import logging
import sys
import traceback

import numpy as np
from mpi4py import MPI

from pserver.comm.backend import select_backend
from pserver.comm.collectives import Allreducer, learner_comm
from pserver.comm.waiting import PeerLog, Waiter

SIZES = (0, 1, 1000, 12345)  # 12345 divides by no bucket below
BUCKET_MIB = (1000 / 2**20, 4096 / 2**20, 1.0)  # ~1000 B, 4 KiB (several buckets), 1 MiB (one)


def data(rank: int, n: int, dtype: np.dtype, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, n, salt])
    return rng.integers(-1000, 1000, n).astype(dtype)


def check_allreduce(comm: MPI.Comm, waiter: Waiter, staging: str, world_ranks: list[int]) -> None:
    backend = select_backend("cpu", 0, 1)
    for dtype in (np.float32, np.float64):
        for n in SIZES:
            for mib in BUCKET_MIB:
                for in_flight in (1, 3, 64):
                    red = Allreducer(comm, backend, waiter, n, dtype, bucket_mib=mib,
                                     in_flight=in_flight, staging=staging)  # fmt: skip
                    assert (red.host is not None) == (staging == "always")
                    for salt in range(2):  # the same object twice: buffers are reused
                        x = data(world_ranks[comm.Get_rank()], n, dtype, salt)
                        want = sum(data(r, n, dtype, salt) for r in world_ranks)
                        red.start(x).wait()
                        assert x.dtype == dtype and np.array_equal(x, want), (n, mib, dtype)


def main() -> None:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    learners = list(range(size - 1, 0, -1)) or [0]  # all but rank 0, in reverse (1 rank: itself)
    comm = learner_comm(world, learners)
    waiter = Waiter(logging.getLogger("collectives"), PeerLog(), stall_timeout=30.0)
    if rank not in learners:
        assert comm is None
    else:
        assert comm is not None and comm.Get_rank() == learners.index(rank)
        assert comm.Get_size() == len(learners)
        order = learners  # comm rank i is world rank learners[i]
        for staging in ("never", "always"):
            check_allreduce(comm, waiter, staging, order)
        comm.Free()
    for staging in ("never", "always"):
        check_allreduce(world, waiter, staging, list(range(size)))
    print(f"collectives ok rank {rank}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # the others would wait in a collective forever: end them all
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
