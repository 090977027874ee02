"""Checkpoints and ``--resume`` of PP-ASGD's prediction layer (``protocol.predict = true`` over
async) on real mpiexec jobs (docs/checkpoints.md): the shard's running staleness mean S̄, the
rate and S of the last update, and the error probe in flight are saved with the block, so a
λ = 1 predicted run stopped and resumed ends with the uninterrupted run's weights, bit for bit.

Before the predictor was saved, the resumed shard served its first pull with a fresh predictor
(rate 0: f_S(w, M) = w), and the resumed weights differed from the uninterrupted run's.
Every job runs under a hard timeout that kills its process group (tests/mpirun.py, and the
watchdog of ``stop_with_sigterm``).
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from pserver.ckpt.files import latest
from tests.test_mpi_checkpoint import (
    assert_resumed_equals_whole,
    final_model,
    job,
    stop_with_sigterm,
    train_rows,
    unslowed,
)

pytestmark = pytest.mark.mpi

# λ = 1 (server, stats, data, one learner); probes every 7 updates, so one is in flight at
# most cuts (an epoch of the quickstart is 85 updates)
PREDICT = ["protocol.name=async", "protocol.predict=true", "protocol.predict_probe=7"]


def test_lambda1_predicted_run_resumed_at_its_end_equals_the_uninterrupted_run(tmp_path):
    """2 epochs, then ``--resume`` for 2 more: the final weights of 4 epochs in one go."""
    a, b = tmp_path / "a", tmp_path / "b"
    first = job(a, *PREDICT, "run.epochs=2")
    assert first.returncode == 0, first.output
    second = job(a, *PREDICT, "run.epochs=4", resume=True)
    assert second.returncode == 0, second.output
    whole = job(b, *PREDICT, "run.epochs=4")
    assert whole.returncode == 0, whole.output
    (wa, attrs_a), (wb, attrs_b) = final_model(a), final_model(b)
    assert attrs_a == attrs_b
    assert np.array_equal(wa, wb)
    with h5py.File(a / "stats.h5", "r") as fa, h5py.File(b / "stats.h5", "r") as fb:
        assert list(fa["test/epoch"][()]) == [1, 2, 3, 4]
        # the dump's prediction rows continue as the uninterrupted run's: S̄ and S included
        for key in ("timestamp", "steps", "staleness_mean"):
            assert np.array_equal(fa[f"predictions/{key}"][()], fb[f"predictions/{key}"][()])
        for key in ("origin", "horizon", "error"):
            ga, gb = fa[f"prediction_errors/{key}"][()], fb[f"prediction_errors/{key}"][()]
            assert np.array_equal(ga, gb), key


def test_sigterm_mid_run_then_resume_equals_the_uninterrupted_predicted_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    slow = [*PREDICT, "run.epochs=3", "inject.compute_time=0.02", "stats.flush_interval=0.1"]
    out, _ = stop_with_sigterm(a, slow)
    manifest = latest(a / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"] is True, out
    assert 20 <= train_rows(a / "stats.h5") < 3 * 85
    assert_resumed_equals_whole(job(a, *slow, resume=True), job(b, *unslowed(slow)), a, b)
