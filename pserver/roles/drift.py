"""How far the learners' models are apart: max |w_i − w_0| over learners i, once per epoch.

Collective over the learners' communicator (every learner calls :meth:`Drift.measure` at the
same epoch end: a lockstep plan's epoch ends fall on the same step index everywhere). Learner
0's weights are broadcast (``Ibcast``), each learner takes its largest difference, and a
``MAX`` reduction of the differences, then one of the learner index that found it, brings
both to every learner; learner 0 records the ``drift`` row. Host copies (one per epoch), so
GPU weights need no CUDA-aware MPI. Waited with the Waiter's back-off.

Liveness: every learner posts the same three collectives in the same order at the same epoch
end, so each completes once every learner has posted it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from pserver.comm.waiting import Waiter


class Drift:
    def __init__(self, comm: MPI.Comm, backend: Any, waiter: Waiter, n: int, dtype: Any) -> None:
        self.comm, self.backend, self.waiter = comm, backend, waiter
        self.mine = np.empty(n, dtype=dtype)
        self.first = np.empty(n, dtype=dtype)

    def measure(self, w: Any) -> tuple[float, int]:
        """(max |w_i − w_0|, i) over the learners; meaningful on learner 0 (collective)."""
        self.backend.copy_to_host(w, self.mine)
        if self.comm.Get_rank() == 0:
            self.first[:] = self.mine
        req = self.comm.Ibcast(self.first, root=0)
        self.waiter.wait(req, "learner 0's weights for the drift check")
        diff = float(np.max(np.abs(self.mine.astype(np.float64) - self.first))) if w.size else 0.0
        local = np.array([diff], dtype=np.float64)
        found = np.zeros(1, dtype=np.float64)
        req = self.comm.Iallreduce(local, found, op=MPI.MAX)
        self.waiter.wait(req, "the learners' drift")
        where = np.array([self.comm.Get_rank() if diff == found[0] and diff > 0 else 0], np.int32)
        first = np.zeros(1, np.int32)
        req = self.comm.Iallreduce(where, first, op=MPI.MAX)
        self.waiter.wait(req, "the learner with the largest drift")
        return float(found[0]), int(first[0])
