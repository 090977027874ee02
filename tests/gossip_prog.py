"""ADPSGD's exchange (pserver.roles.gossip) on every rank of an mpiexec job, all ranks learners
(run by tests/test_mpi_gossip.py and scripts/soak_gossip.py).

``python tests/gossip_prog.py MODE SEED``: each learner takes a number of steps drawn from
SEED (some take none, as when the data server's minibatches run out before a learner asks),
"computes" with a random injected delay, applies a pseudo-random gradient and exchanges after
each step. It must end (no deadlock, every goodbye matched), and the exchanges must be doubly
stochastic: the sum of the final models equals the sum of the initial ones minus every update
applied (float64, to rounding). Prints ``gossip ok rank R exchanges E`` per rank.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from pserver.comm.backend import StagingBuffers, select_backend
from pserver.comm.waiting import PeerLog, Waiter
from pserver.roles.gossip import Gossip

N = 1001
LR = 0.05


def gradient(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng([rank, step, 7]).standard_normal(N)


def main(mode: str, seed: int, staging: bool) -> None:
    world = MPI.COMM_WORLD
    comm = world.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng([seed, size])
    steps = rng.choice([0, 1, 2, 5, 12, 30], size=size)
    delay = rng.uniform(0.0, 3e-3, size=size) * rng.choice([1, 1, 10], size=size)
    mine = np.random.default_rng([seed, rank])
    waiter = Waiter(logging.getLogger("gossip"), PeerLog(), stall_timeout=30.0)
    backend = select_backend("cpu", 0, 1)
    w = np.random.default_rng(seed).standard_normal(N)
    w0 = w.copy()

    def apply(w: np.ndarray, g: np.ndarray, step: int) -> None:
        w -= LR * g

    stage = StagingBuffers(backend, [N, N], np.float64) if staging else None
    gossip = Gossip(comm, np, waiter, w, apply, threaded=mode == "thread", stage=stage)
    applied = np.zeros(N)
    try:
        for step in range(int(steps[rank])):
            gossip.snapshot()
            time.sleep(mine.uniform(0, delay[rank]))  # injected compute time
            g = gradient(rank, step)
            applied += LR * g
            gossip.update(g)
        gossip.wait_exchange()
    finally:
        gossip.close()
    gossip.finish()
    rows = gossip.take_rows()
    assert len(rows) == gossip.exchanged
    finals = np.empty((size, N)) if rank == 0 else None
    comm.Gather(gossip.w, finals, root=0)
    totals = np.empty((size, N)) if rank == 0 else None
    comm.Gather(applied, totals, root=0)
    counts = comm.gather((gossip.role, gossip.exchanged, int(steps[rank])), root=0)
    if rank == 0:
        want = size * w0 - totals.sum(axis=0)
        err = float(np.max(np.abs(finals.sum(axis=0) - want)))
        assert err < 1e-9 * max(1.0, float(np.max(np.abs(want)))) * 100, f"sum drifted by {err}"
        sent = sum(s for role, _, s in counts if role == "sender")
        served = sum(e for role, e, _ in counts if role == "receiver")
        assert sent == served, (sent, served, counts)  # every request answered once
    comm.Free()
    print(f"gossip ok rank {rank} exchanges {gossip.exchanged}", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "staged")
    except BaseException:  # the others would wait forever: end them all
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
