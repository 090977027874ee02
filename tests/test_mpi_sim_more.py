"""pserver-sim's PP-ASGD, overlapped learners and trees against real runs where a real run is
deterministic (issue 23): one learner, so no other learner's timing decides an arrival order."""

from __future__ import annotations

import numpy as np
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


#: overlapped runs whose arrival order no timing decides: hardsync and psp wait for each new
#: model (at any λ under hardsync: every round takes every learner), and one async learner
#: with comm.max_inflight = 1 waits for the answer acknowledging its push (serial SGD)
OVERLAPPED = {
    "hardsync-thread": (1, ["protocol.name=hardsync", "comm.mode=thread"]),
    "psp-nonblocking": (1, ["protocol.name=psp", "protocol.c=1", "comm.mode=nonblocking"]),
    "async-inflight-1": (1, ["protocol.name=async", "comm.mode=nonblocking",
                             "comm.max_inflight=1"]),
    "hardsync-4-nonblocking": (4, ["protocol.name=hardsync", "comm.mode=nonblocking"]),
}


@pytest.mark.parametrize("case", sorted(OVERLAPPED))
def test_overlapped_engines_agree_exactly_where_deterministic(tmp_path, case):
    n, overrides = OVERLAPPED[case]
    real, sim = real_and_simulated(tmp_path, n, overrides)
    assert real.rows("updates") > 20
    same(real, sim, "updates", UPDATES)
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
    if n == 1:
        same(real, sim, "gradients", ("learner", "timestamp", "staleness", "update"))
        same(real, sim, "staleness", ("learner", "version", "staleness"))
        same(real, sim, "train", ("learner", "step"))
    else:  # the order within a round is timing: each round took every learner once, σ = 0
        for dump in (real, sim):
            g = dump.group("gradients")
            for u in np.unique(g["update"]):
                assert sorted(g["learner"][g["update"] == u]) == list(range(n))
            assert np.all(g["staleness"] == 0)
    rounds = lambda d: sorted(zip(d.group("learners")["learner"],  # noqa: E731
                                  d.group("learners")["minibatches"], strict=True))
    assert rounds(real) == rounds(sim)


def test_one_overlapped_async_learner_stays_within_the_window_in_both(tmp_path):
    """With the default window of 2 the order of a reply and the next compute is timing, so
    the runs need not agree row by row; both keep σ ≤ limit − 1 = 1 (pserver.protocols.inflight)
    and take every gradient."""
    real, sim = real_and_simulated(tmp_path, 1, ["protocol.name=async", "comm.mode=thread"])
    for d in (real, sim):
        assert d.group("staleness")["staleness"].max() <= 1
    same(real, sim, "blocks", ("timestamp", "applied", "dropped"))
