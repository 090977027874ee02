"""The learners' collectives (:mod:`pserver.comm.collectives`) in real mpiexec runs."""

from __future__ import annotations

import re

import pytest
from mpirun import ROOT, run_program

pytestmark = pytest.mark.mpi

PROGRAM = ROOT / "tests" / "collectives_prog.py"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_allreduce_and_ring_equal_numpy_sums(n):
    res = run_program(n, PROGRAM, timeout=180)
    assert res.returncode == 0, res.output
    # ranks' lines may interleave without a newline between them: find them anywhere
    assert sorted(re.findall(r"collectives ok rank (\d+)", res.stdout)) == [
        str(r) for r in range(n)
    ], res.output
