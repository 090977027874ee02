"""Resume bit-exactness of the overlapped learner (``comm.mode`` thread | nonblocking) on real
mpiexec jobs (docs/checkpoints.md, *The overlapped learner's pipeline*).

λ = 1 async, with and without PP-ASGD's prediction layer: stopped at a run's end (then
``--resume`` for more epochs) or by SIGTERM mid-run, the resumed run ends with the weights of
the uninterrupted one, bit for bit. Before the learner saved its pipeline (the compute copy,
the answer in flight, the in-flight window and the pushes its shards dropped at their stop),
its first minibatch after a resume waited for the shards' current model where the
uninterrupted run computed on the copy its pull had in flight, and the weights differed.
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

PREDICT = ["protocol.predict=true", "protocol.predict_probe=7"]
# The uninterrupted overlapped run is deterministic only while the learner, right after a push,
# reaches its next minibatch before the answer to the pull that followed the push is in: then
# every minibatch from the second on waits for the answer its in-flight window requires
# (pserver.protocols.inflight) and computes on it. A shard quicker than that (a learner descheduled
# between its push and its next minibatch) lets it compute on a newer model once, and the runs
# differ from there, resumed or not. A shard slowed down 30 times (it sleeps after handling each
# message) keeps the learner ahead; the arithmetic is unchanged.
AHEAD = ["inject.slow_server=0", "inject.server_factor=30"]
CASES = [
    pytest.param(["comm.mode=thread"], id="thread"),
    pytest.param(["comm.mode=nonblocking"], id="nonblocking"),
    pytest.param(["comm.mode=thread", *PREDICT], id="thread-predict"),
]


@pytest.mark.parametrize("setting", CASES)
def test_overlapped_lambda1_resumed_at_a_run_end_equals_the_uninterrupted_run(tmp_path, setting):
    """2 epochs, then ``--resume`` for 2 more: the final weights of 4 epochs in one go (the
    gradient the learner computed after the shards' stop is pushed again on resume)."""
    a, b = tmp_path / "a", tmp_path / "b"
    setting = ["protocol.name=async", *AHEAD, *setting]
    first = job(a, *setting, "run.epochs=2")
    assert first.returncode == 0, first.output
    second = job(a, *setting, "run.epochs=4", resume=True)
    assert second.returncode == 0, second.output
    whole = job(b, *setting, "run.epochs=4")
    assert whole.returncode == 0, whole.output
    (wa, attrs_a), (wb, attrs_b) = final_model(a), final_model(b)
    assert attrs_a == attrs_b
    assert np.array_equal(wa, wb)
    with h5py.File(a / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2, 3, 4]


@pytest.mark.parametrize("setting", CASES)
def test_overlapped_lambda1_sigterm_then_resume_equals_the_uninterrupted_run(tmp_path, setting):
    """SIGTERM once the dump shows 20 minibatches (exit 75), ``--resume``: the final weights of
    the uninterrupted run (the answer of the learner's last pull is its next compute copy)."""
    a, b = tmp_path / "a", tmp_path / "b"
    slow = ["protocol.name=async", *AHEAD, *setting, "run.epochs=3", "inject.compute_time=0.02",
            "stats.flush_interval=0.1"]  # fmt: skip
    out, _ = stop_with_sigterm(a, slow)
    manifest = latest(a / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"] is True, out
    assert 20 <= train_rows(a / "stats.h5") < 3 * 85
    assert_resumed_equals_whole(job(a, *slow, resume=True), job(b, *unslowed(slow)), a, b)
    with h5py.File(a / "stats.h5", "r") as f:
        steps = f["train/step"][()]
        assert list(steps) == list(range(len(steps)))  # one row per minibatch, in order
