"""run.blas_threads: one BLAS thread per rank unless the user already chose."""

from __future__ import annotations

import logging

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from pserver.blas import blas_thread_limit, limit_blas_threads


def test_auto_is_one_thread_per_rank_unless_the_environment_chose():
    assert blas_thread_limit(0, {}) == 1
    assert blas_thread_limit(0, {"PATH": "/bin"}) == 1
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        assert blas_thread_limit(0, {name: "4"}) is None
    assert blas_thread_limit(0, {"OMP_NUM_THREADS": " "}) == 1  # set but empty: not a choice
    assert blas_thread_limit(3, {"OMP_NUM_THREADS": "8"}) == 3  # the config says it outright
    with pytest.raises(ValueError):
        blas_thread_limit(-1, {})


def test_the_limit_reaches_the_loaded_blas(monkeypatch):
    import numpy as np

    np.dot(np.ones(4), np.ones(4))  # make sure numpy's BLAS is loaded
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("no BLAS library visible to threadpoolctl")
    original = {i["filepath"]: i["num_threads"] for i in blas}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    try:
        assert limit_blas_threads(0, logging.getLogger("test")) == 1
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert limit_blas_threads(0, logging.getLogger("test")) is None
    finally:
        threadpool_limits(limits=max(original.values()), user_api="blas")
