"""pserver-sim's PP-ASGD, overlapped learners and trees against real runs where a real run is
deterministic (issue 23): one learner, so no other learner's timing decides an arrival order."""

from __future__ import annotations

import pytest
from test_mpi_sim import real_and_simulated, same

pytestmark = pytest.mark.mpi

UPDATES = ("timestamp", "n_gradients", "mean_staleness", "lr", "vector_clock")

PREDICTED = {
    "async": ["protocol.name=async", "protocol.predict=true"],
    "softsync-fixed-s": ["protocol.name=softsync", "protocol.n=1", "protocol.predict=true",
                         "protocol.predict_steps=2"],
}


@pytest.mark.parametrize("case", sorted(PREDICTED))
def test_pp_asgd_with_one_learner_agrees_exactly(tmp_path, case):
    real, sim = real_and_simulated(tmp_path, 1, PREDICTED[case])
    assert real.rows("predictions") > 50
    same(real, sim, "updates", UPDATES)
    same(real, sim, "gradients", ("learner", "timestamp", "staleness", "update"))
    same(real, sim, "predictions", ("shard", "timestamp", "steps", "staleness_mean"))
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
    same(real, sim, "learners", ("minibatches", "samples"))
