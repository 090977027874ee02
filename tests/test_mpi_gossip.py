"""ADPSGD's exchange on real mpiexec jobs (tests/gossip_prog.py): random injected delays and
step counts for λ = 2, 3, 5, 8, both comm engines and the staging path; every run must end
(no hang: each job runs under a hard timeout), every request be answered once and the mix be
doubly stochastic (the sum of the models moves by the updates only). The 50-run version for
the note is ``scripts/soak_gossip.py``."""

from __future__ import annotations

import re

import pytest
from mpirun import ROOT, run_program

pytestmark = pytest.mark.mpi

PROGRAM = ROOT / "tests" / "gossip_prog.py"


@pytest.mark.parametrize(
    "n, mode, seed, staged",
    [(2, "thread", 1, False), (3, "nonblocking", 2, False), (5, "thread", 3, True),
     (8, "thread", 4, False), (8, "nonblocking", 5, False)],
)  # fmt: skip
def test_gossip_ends_answers_every_request_and_keeps_the_sum(n, mode, seed, staged):
    args = [mode, str(seed), *(["staged"] if staged else [])]
    res = run_program(n, PROGRAM, args, timeout=180)
    assert res.returncode == 0, res.output
    assert sorted(re.findall(r"gossip ok rank (\d+)", res.stdout), key=int) == [
        str(r) for r in range(n)
    ], res.output
