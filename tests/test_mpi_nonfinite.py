"""A non-finite gradient is named by the learner that computed it, under every family (issue
22, D6): on the code before only the loss was checked, and the run failed a step later on
whichever learner then computed on poisoned weights — under SYNC and ADPSGD never the one that
made it. ``tests/faults/nan_gradient.py`` makes learner 1's second gradient infinite, its loss
finite."""

from __future__ import annotations

import pytest
from mpirun import ROOT, run_job

pytestmark = pytest.mark.mpi

MODEL = f"model.module={ROOT / 'tests' / 'faults' / 'nan_gradient.py'}:InfOnce"
# strategy -> (world size, the rank of learner 1)
CASES = {"async": (7, 4), "sync": (6, 3), "adpsgd": (6, 3), "hybrid": (6, 3)}


@pytest.mark.parametrize("name", list(CASES))
def test_the_learner_that_made_a_non_finite_gradient_is_named_first(tmp_path, name):
    n, rank = CASES[name]
    res = run_job(
        n,
        [str(ROOT / "examples" / "quickstart.toml"), f"run.out_dir={tmp_path}",
         "stats.progress=false", f"protocol.name={name}", "model.kind=python", MODEL],
        timeout=120, env={"NAN_RANK": str(rank), "NAN_CALL": "3"},
    )  # fmt: skip
    assert res.returncode != 0, res.output
    said = [ln for ln in res.output.splitlines() if ln.startswith("pserver-run:")]
    assert said, res.output
    assert f"rank {rank} (learner 1)" in said[0], said
    # its third loss_grad: the first is the plain interface's probe at start-up (learners.plain)
    assert "learner 1: its gradient at step 1 (minibatch #2" in said[0], said
