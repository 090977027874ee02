"""How many BLAS threads each rank may use.

Every rank is its own process, and numpy/scipy's OpenBLAS starts one thread per core in each of
them: 7 ranks on 2 cores would run 14 BLAS threads, and OpenBLAS's idle threads spin before they
sleep, taking the cores the other ranks compute and communicate on (docs/performance.md, "BLAS
threads per rank", has the figures and the command). MPI codes set ``OMP_NUM_THREADS=1`` per
rank for the same reason.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

# Variables through which a user already chose the threads of the BLAS libraries.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_thread_limit(setting: int, env: Mapping[str, str] = os.environ) -> int | None:
    """The per-rank limit to apply for ``run.blas_threads = setting``, or None to leave it.

    ``setting`` > 0 is taken as given. 0 ("auto") means one thread per rank, unless one of
    ``THREAD_ENV`` is set: then the user (or the batch system) already chose, and it stays.
    """
    if setting < 0:
        raise ValueError(f"run.blas_threads must be >= 0, got {setting}")
    if setting > 0:
        return setting
    if any(env.get(name, "").strip() for name in THREAD_ENV):
        return None
    return 1


_chosen: int | None = None  # the limit limit_blas_threads applied in this process


def limit_blas_threads(setting: int, log: logging.Logger) -> int | None:
    """Apply :func:`blas_thread_limit` to every BLAS library loaded in this process."""
    global _chosen
    limit = blas_thread_limit(setting)
    if limit is None:
        log.debug("BLAS threads left as %s chose them", "/".join(THREAD_ENV))
        _chosen = None
        return None
    _chosen = limit
    limit_late_blas()
    log.debug("BLAS threads per rank: %d (run.blas_threads)", limit)
    return limit


def limit_late_blas() -> None:
    """Apply the limit chosen at start to BLAS libraries loaded since; call after loading one.

    threadpoolctl limits the libraries loaded when it is called. SciPy wheels bring their own
    OpenBLAS, which only the SGD update loads (:func:`pserver.optim.rules._blas_axpy`, called by
    :func:`pserver.optim.rules.preload` before the start barrier on a shard); left out of
    the limit it starts one thread per core, which spin beside the shard's own.
    """
    if _chosen is None:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=_chosen, user_api="blas")
    torch = sys.modules.get("torch")  # model.kind = "torch": its intra-op pool, not only BLAS
    if torch is not None:
        torch.set_num_threads(_chosen)
