"""A key the run ignores but does not refuse is warned about once per run, by rank 0 alone
(pserver/plan/unused.py; pserver/job/cli.py logs it after reading the config)."""

from __future__ import annotations

import pytest
from mpirun import train

pytestmark = pytest.mark.mpi


def test_ignored_key_warned_once_and_the_run_goes_on(tmp_path):
    # the quickstart sets protocol.n = 1 under hardsync: before, accepted in silence
    res = train(tmp_path, 4, "run.epochs=1")
    line = 'protocol.n = 1 belongs to softsync; protocol.name = "hardsync" does not use it'
    warned = [ln for ln in res.stderr.splitlines() if line in ln]
    assert len(warned) == 1, res.output
    assert "[rank 0 " in warned[0] and " WARNING " in warned[0]
