"""The shipped quickstart starts quietly (issue 25, "no silent traps"): not a single WARNING
line, so that a real warning does not drown; the file's keys the run does not read are listed
once, at INFO level, by rank 0 alone (pserver/plan/unused.py); the layout is one line."""

from __future__ import annotations

import pytest
from mpirun import train

pytestmark = pytest.mark.mpi


def test_quickstart_prints_no_warning_and_lists_unread_keys_once(tmp_path):
    res = train(tmp_path, 7, "run.epochs=2")
    lines = res.stderr.splitlines()
    assert not [ln for ln in lines if " WARNING " in ln], res.output
    # the quickstart sets protocol.n = 1 for softsync; under hardsync it is listed, not warned
    listed = [ln for ln in lines if "does not read" in ln and "protocol.n = 1 (softsync)" in ln]
    assert len(listed) == 1, res.output
    assert "[rank 0 " in listed[0] and " INFO " in listed[0]
    layout = [ln for ln in lines if " layout: " in ln]
    assert len(layout) == 1, res.output
    assert "λ = 4 learners (ranks 3-6), 1 shard (rank 0), stats rank 1, data rank 2" in layout[0]
