"""run.blas_threads: one BLAS thread per rank unless the user already chose."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from pserver.optim.blas import THREAD_ENV, blas_thread_limit, limit_blas_threads


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


def test_the_limit_reaches_scipys_blas_loaded_later_by_the_sgd_update():
    # a fresh process: in this one pytest may already have loaded everything
    code = """
import json
import logging
from threadpoolctl import threadpool_info
from pserver.optim.blas import limit_blas_threads
from pserver.plan.config import OptimConfig
from pserver.optim.rules import make_updater
import numpy as np
limit_blas_threads(0, logging.getLogger("t"))
w, g = np.zeros(1000, np.float32), np.ones(1000, np.float32)
make_updater(OptimConfig(rule="sgd", lr=0.1, weight_decay=0.0), 1000, np, w.dtype).step(w, g, 0.1)
assert np.allclose(w, -0.1)
print(json.dumps([(i["filepath"], i["num_threads"]) for i in threadpool_info()
                  if i["user_api"] == "blas"]))
"""
    libs = blas_libs_of(code)
    assert any("scipy" in path for path, _ in libs), libs  # SciPy's own BLAS was loaded
    assert all(n == 1 for _, n in libs), libs


def test_a_shard_loads_scipys_blas_before_training_within_the_limit():
    # pserver.optim.rules.preload runs before the start barrier (cli.run): imported at the first
    # update instead, SciPy took 1-3 s while overlapped learners computed on w0
    code = """
import json
import logging
import sys
from threadpoolctl import threadpool_info
from pserver.optim.blas import limit_blas_threads
from pserver.optim.rules import preload
import numpy as np
limit_blas_threads(0, logging.getLogger("t"))
assert "scipy.linalg.blas" not in sys.modules
preload("momentum", np, np.float32)
assert "scipy.linalg.blas" not in sys.modules  # only the SGD update uses SciPy
preload("sgd", np, np.float32)
assert "scipy.linalg.blas" in sys.modules
print(json.dumps([(i["filepath"], i["num_threads"]) for i in threadpool_info()
                  if i["user_api"] == "blas"]))
"""
    libs = blas_libs_of(code)
    assert any("scipy" in path for path, _ in libs), libs
    assert all(n == 1 for _, n in libs), libs


def blas_libs_of(code: str) -> list[tuple[str, int]]:
    """Run ``code`` in a fresh Python without the thread variables; the (library, threads)
    pairs of BLAS it prints as JSON."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
