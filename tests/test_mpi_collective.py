"""SYNC and HYBRID under mpiexec (issue 12): the serial references bit for bit at λ = 1, the
cross-family check against hardsync, learning at λ = 4 in every comm.mode, the staleness and
drift records, the dump schema and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from mpirun import QUICKSTART, assert_learned, final_weights, run_job, train

from learners.data import load_dataset
from learners.serial import serial_steps, train_serial, train_serial_delayed
from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump, summarize
from pserver.dump.schema import GROUPS
from pserver.plan.config import load_config
from pserver.stats.cli import format_summary

pytestmark = pytest.mark.mpi



@pytest.mark.parametrize(
    "overrides",
    [
        ("protocol.name=sync",),
        ("protocol.name=sync", "optim.rule=adagrad", "comm.mode=nonblocking"),
        ("protocol.name=sync", "optim.lr_milestones=[1]", "comm.staging=always"),
        ("protocol.name=sync", "optim.rule=nesterov", "comm.bucket_mib=0.01", "comm.mode=thread"),
        ("protocol.name=sync", "optim.warmup_epochs=1.5", "optim.lr_decay=0.5"),
    ],
    ids=["sync", "sync-adagrad-nonblocking", "sync-step-decay-staged", "sync-buckets-thread",
         "sync-warmup-anneal"],
)
def test_sync_one_learner_is_serial_sgd_bit_for_bit(tmp_path, overrides):
    common = ("run.epochs=2", "optim.weight_decay=0.001", *overrides)
    train(tmp_path, 3, *common)
    cfg = load_config(QUICKSTART, list(common))
    w_serial = train_serial(cfg, load_dataset(cfg.data, cfg.run.seed))
    assert np.array_equal(final_weights(tmp_path), w_serial)


@pytest.mark.parametrize("mode", ["thread", "blocking"])
def test_hybrid_one_learner_is_the_delayed_serial_reference_bit_for_bit(tmp_path, mode):
    common = ("protocol.name=hybrid", f"comm.mode={mode}", "run.epochs=2",
              "optim.lr_milestones=[1]", "comm.staging=always")
    train(tmp_path, 3, *common)
    cfg = load_config(QUICKSTART, list(common))
    ds = load_dataset(cfg.data, cfg.run.seed)
    w = final_weights(tmp_path)
    assert np.array_equal(w, train_serial_delayed(cfg, ds))
    assert not np.allclose(w, train_serial(cfg, ds))  # one step late is another run
    e = load_dump(tmp_path / "stats.h5").group("exchanges")
    assert e["step"].tolist() == list(range(serial_steps(cfg, len(ds.y_train))))


def test_sync_equals_hardsync_on_the_same_minibatches(tmp_path):
    """Cross-family: λ = 3, every minibatch the whole training set (so every step's λ
    minibatches are the same for both, whatever the arrival order at hardsync's data server),
    the same rate α0 (hardsync's √(λμ/B) = 1 with B = λμ): SYNC's allreduce-then-local-update
    ends at hardsync's weights."""
    n_train = len(load_dataset(load_config(QUICKSTART).data, 0).y_train)
    common = ("run.epochs=12", f"data.batch_size={n_train}", "data.prefetch=1")
    train(tmp_path / "sync", 5, "protocol.name=sync", *common)
    train(tmp_path / "hardsync", 6, "protocol.name=hardsync", f"protocol.ref_batch={3 * n_train}",
          *common)
    w_sync, w_hard = final_weights(tmp_path / "sync"), final_weights(tmp_path / "hardsync")
    assert load_dump(tmp_path / "sync" / "stats.h5").rows("exchanges") == 3 * 4
    assert not np.allclose(w_sync, final_weights_init(common))  # training moved them
    np.testing.assert_allclose(w_sync, w_hard, rtol=1e-4, atol=1e-5)


def final_weights_init(common):
    from learners.models import build_model

    cfg = load_config(QUICKSTART, list(common))
    ds = load_dataset(cfg.data, cfg.run.seed)
    return build_model(cfg.model, ds.n_features, ds.n_classes).init_params(cfg.run.seed)


def check_lockstep_dump(path, sigma_after_first: int):
    dump = load_dump(path / "stats.h5")
    assert check_dump(dump) == []
    assert set(dump.groups) <= set(GROUPS) | {"model"}
    e = dump.group("exchanges")
    steps = e["step"]
    per_learner = [int(np.sum(e["learner"] == i)) for i in range(4)]
    assert len(set(per_learner)) == 1 and per_learner[0] == steps.max() + 1  # lockstep
    assert np.all(e["partner"] == -1) and np.all(e["partner_age"] == -1)
    # σ per applied contribution (docs/stats.md): one staleness row per exchanges row
    st = dump.group("staleness")
    assert st["learner"].tolist() == e["learner"].tolist()
    assert np.all(st["staleness"][steps == 0] == 0)
    assert np.all(st["staleness"][steps > 0] == sigma_after_first)
    drift = dump.group("drift")
    assert drift["epoch"].tolist() == list(range(1, 21)) and np.all(drift["max_diff"] == 0.0)
    assert dump.rows("test") == 20
    summary = summarize(dump)  # pserver-stats summary shows the exchanges' σ and the drift
    assert summary["exchanges"]["staleness"]["max"] == sigma_after_first
    assert summary["exchanges"]["max_drift"] == 0.0
    assert summary["staleness"]["max"] == sigma_after_first
    assert "⟨σ⟩ over gradients" in format_summary(summary)
    return dump


@pytest.mark.parametrize("mode", ["blocking", "nonblocking", "thread"])
def test_sync_four_learners_learn_with_zero_staleness(tmp_path, mode):
    train(tmp_path, 6, "protocol.name=sync", f"comm.mode={mode}", timeout=240)
    assert_learned(check_lockstep_dump(tmp_path, 0))


@pytest.mark.parametrize("mode", ["thread", "blocking"])
def test_hybrid_four_learners_learn_with_staleness_one(tmp_path, mode):
    train(tmp_path, 6, "protocol.name=hybrid", f"comm.mode={mode}", timeout=240)
    assert_learned(check_lockstep_dump(tmp_path, 1))


@pytest.mark.parametrize(
    "overrides, env, fragment",
    [
        (["protocol.name=sync", "cluster.servers=1"], {}, "cluster.servers = 1: protocol.name"),
        (["protocol.name=sync", "cluster.tree_fanout=2"], {}, "cluster.tree_fanout configures"),
        (["protocol.name=hybrid"], {"MPI4PY_RC_THREAD_LEVEL": "serialized"},
         "needs MPI_THREAD_MULTIPLE"),
    ],
    ids=["servers", "tree", "hybrid-no-thread-multiple"],
)
def test_bad_input_one_line_exit_2(tmp_path, overrides, env, fragment):
    res = run_job(4, [str(QUICKSTART), f"run.out_dir={tmp_path}", *overrides], 60, env=env)
    assert res.returncode == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(errors) == 1 and fragment in errors[0], res.output
    assert "Traceback" not in res.output


def test_lockstep_runs_do_not_depend_on_timing(tmp_path):
    """Learner i's k-th minibatch is draw kλ + i (``LockstepDraws``): a SYNC run is the same
    whatever the arrival order, here with one learner 5x slower and another mode."""
    common = ("protocol.name=sync", "run.epochs=2")
    train(tmp_path / "a", 5, *common)
    train(tmp_path / "b", 5, *common, "comm.mode=thread", "inject.slow_learner=1",
          "inject.learner_factor=5")
    assert np.array_equal(final_weights(tmp_path / "a"), final_weights(tmp_path / "b"))


def test_stats_plot_shows_the_exchanges_staleness(tmp_path):
    from pserver.stats.plots import plot_staleness

    train(tmp_path, 4, "protocol.name=hybrid", "run.epochs=1")
    dump = load_dump(tmp_path / "stats.h5")
    assert plot_staleness(dump, tmp_path / "s.png").stat().st_size > 0
    assert summarize(dump)["exchanges"]["staleness"]["histogram"] == {
        0: 2, 1: dump.rows("exchanges") - 2,
    }


def test_bench_collective_times_a_sync_step(tmp_path):
    import json
    import subprocess
    import sys

    from mpirun import ROOT

    out = tmp_path / "c.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_collective.py"), "--skip", "bandwidth",
         "cpu", "--repeats", "1", "--reps", "2", "--sizes", "0.05", "--ranks", "2",
         "--quiet-idle", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SYNC allreduce" in proc.stdout
    doc = json.loads(out.read_text())["sync"]
    assert set(doc) == {"MPI_Allreduce", "SYNC allreduce", "SYNC step"}
    assert all(v > 0 for v in doc.values())


@pytest.mark.parametrize("name", ["sync", "hybrid"])
def test_a_failing_learner_ends_the_job_while_the_others_wait_in_the_allreduce(tmp_path, name):
    import socket

    res = run_job(6, [str(QUICKSTART), f"run.out_dir={tmp_path}", f"protocol.name={name}",
                      "inject.fail_learner=1", "inject.fail_step=3"], timeout=60)  # fmt: skip
    assert res.returncode != 0
    assert f"rank 3 (learner 1) on {socket.gethostname()} failed" in res.stderr, res.output
    assert "failure injected at step 3" in res.stderr


def test_staged_bucketed_allreduce_equals_the_direct_one(tmp_path):
    """Item 7's CPU staging path (``comm.staging=always``: the pinned-buffer copies a GPU
    array takes) with many small buckets gives the direct path's weights, λ = 3 (to rounding:
    an MPI library may pick another summation order for another message size)."""
    common = ("protocol.name=sync", "run.epochs=2")
    train(tmp_path / "direct", 5, *common)
    train(tmp_path / "staged", 5, *common, "comm.staging=always", "comm.bucket_mib=0.004")
    np.testing.assert_allclose(
        final_weights(tmp_path / "staged"), final_weights(tmp_path / "direct"), rtol=1e-5,
        atol=1e-7,
    )
