"""Settings that cannot take effect stop the job before training (issue 25, "no silent traps"):
one ``pserver-run: error:`` line, exit status 2, nothing written."""

from __future__ import annotations

import pytest
from mpirun import QUICKSTART, run_job

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "n, overrides, expected",
    [
        # the same -n 7 gives λ = 4 with a shard, 5 without: the λ asked for names its -n
        (7, ["protocol.name=sync", "cluster.learners=4"], "needs mpiexec -n 6 "),
        (4, ["protocol.pull_fraction=0.5"], "protocol.pull_fraction = 0.5 with 1 parameter block"),
        # blocks.split = "layer": the count (4 tensors of the MLP) is known at start-up only
        (4, ["protocol.pull_fraction=0.9", "blocks.split=layer"], "with 4 parameter block(s)"),
        (4, ["protocol.name=async", "protocol.n=4"], 'protocol.n = 4 belongs to softsync'),
    ],
    ids=["lambda-mismatch", "partial-pull-one-block", "partial-pull-layers", "typed-unused-key"],
)
def test_a_setting_that_cannot_take_effect_is_one_error_line_exit_2(tmp_path, n, overrides,
                                                                    expected):
    res = run_job(n, [str(QUICKSTART), f"run.out_dir={tmp_path}", *overrides], timeout=60)
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1 and expected in lines[0], res.output
    assert not (tmp_path / "stats.h5").exists()
