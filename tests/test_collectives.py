"""Bucketing, the ring, and the collectives on one process (``COMM_SELF``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from mpi4py import MPI
from mpirun import ROOT

from pserver.comm.backend import select_backend
from pserver.comm.collectives import Allreducer, buckets
from pserver.comm.waiting import PeerLog, Waiter


def test_buckets_cover_every_element_once_with_a_short_last_one():
    got = buckets(10, 4, 8 / 2**20)  # two float32 per bucket
    assert got == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert buckets(11, 4, 16 / 2**20) == [(0, 4), (4, 8), (8, 11)]
    assert buckets(0, 8, 1.0) == [(0, 0)]
    assert buckets(5, 8, 1e-9) == [(i, i + 1) for i in range(5)]  # never empty buckets
    with pytest.raises(ValueError):
        buckets(5, 4, 0)


def waiter() -> Waiter:
    return Waiter(logging.getLogger("test"), PeerLog(), stall_timeout=30.0)


@pytest.mark.parametrize("staging", ["never", "always"])
def test_one_rank_allreduce_leaves_the_array(staging):
    backend = select_backend("cpu", 0, 1)
    x = np.arange(1001, dtype=np.float32)
    red = Allreducer(MPI.COMM_SELF, backend, waiter(), x.size, x.dtype, bucket_mib=1600 / 2**20,
                     in_flight=2, staging=staging)  # fmt: skip
    assert len(red.buckets) == 3
    h = red.start(x)  # in_flight=2 of 3 buckets: not complete before the next test
    assert not h.done
    with pytest.raises(RuntimeError):  # one operation at a time: the buffers are shared
        red.start(x)
    h.wait()
    assert np.array_equal(x, np.arange(1001, dtype=np.float32))
    with pytest.raises(ValueError):
        red.start(np.zeros(5, np.float32))


def test_learner_ranks_follow_the_layout_and_are_empty_for_bad_input(tmp_path):
    from pserver.plan.config import load_config
    from pserver.runtime.context import learner_ranks

    cfg = str(ROOT / "examples" / "quickstart.toml")

    def load(path: str, *overrides: str):  # noqa: ANN202 - the loader of a config
        return lambda: load_config(path, list(overrides))

    assert learner_ranks(load(cfg), 7, [0] * 7) == (3, 4, 5, 6)  # 1 shard, stats, data, 4
    assert learner_ranks(load(cfg, "cluster.servers=2"), 7, [0] * 7) == (4, 5, 6)
    assert learner_ranks(load(cfg), 2, [0] * 2) == ()  # too few ranks: prepare says so
    assert learner_ranks(load(str(tmp_path / "missing.toml")), 7, [0] * 7) == ()


def test_gpu_arrays_are_staged_unless_mpi_is_cuda_aware():
    from pserver.comm.backend import Backend
    from pserver.comm.payload import staged

    gpu, aware = Backend("gpu", np, 0, False), Backend("gpu", np, 0, True)
    cpu = select_backend("cpu", 0, 1)
    assert staged(gpu, "auto") and not staged(aware, "auto") and not staged(cpu, "auto")
    assert staged(cpu, "always") and not staged(gpu, "never")
