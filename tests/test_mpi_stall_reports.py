"""Stall reports say what was last received and how long ago, under every exchange (issue 22,
D9): the peer-to-peer and collective families used to report "nothing received yet" after
seconds of exchanges, since only the parameter-server inbox noted what arrived.

Learner 1 stops for ``FREEZE`` s without calling MPI (``inject.freeze_*``, as a ``SIGSTOP``ped
process would), longer than ``comm.stall_timeout``: the learners waiting on it report.
"""

from __future__ import annotations

import re

import pytest
from mpirun import train

pytestmark = pytest.mark.mpi

FREEZE = (
    "inject.freeze_learner=1", "inject.freeze_step=4", "inject.freeze_time=3.0",
    "comm.stall_timeout=1.0", "run.epochs=1", "inject.compute_time=0.003",
)  # fmt: skip
SUM = r"the learners' allreduce: the sum of step \d+'s gradients"
CASES = {
    # ADPSGD: a learner's last average with a named partner
    "adpsgd": (("protocol.name=adpsgd",), r"rank \d+ \(learner \d\): its model of step \d+"),
    # SYNC and HYBRID: the learners' allreduce as one source
    "sync": (("protocol.name=sync",), SUM),
    "hybrid": (("protocol.name=hybrid",), SUM),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_stall_report_names_the_last_message_and_its_age(tmp_path, case):
    overrides, source = CASES[case]
    out = train(tmp_path, 6, *FREEZE, *overrides, timeout=180).output
    # the learners waiting on the stopped one (the statistics server may truly have heard
    # nothing yet: the learners report every stats.flush_interval)
    stalls = [ln for ln in out.splitlines() if "stalled" in ln and " learner " in ln]
    assert stalls, out
    assert not any("nothing received" in ln for ln in stalls), stalls
    assert any(re.search(source + r", \d+\.\d s ago", ln) for ln in stalls), stalls
