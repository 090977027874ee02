"""Bad input fails before training on every rank with one message; a crash aborts the job."""

from __future__ import annotations

import re
import socket

import numpy as np
import pytest
from mpirun import QUICKSTART, run_job, train

from pserver.dump.reader import load_dump

pytestmark = pytest.mark.mpi


def fails(tmp_path, n, *overrides, config=QUICKSTART):
    res = run_job(n, [str(config), f"run.out_dir={tmp_path}", *overrides], timeout=60)
    assert res.returncode != 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1, res.output  # one message, not one per rank
    assert not (tmp_path / "stats.h5").exists()  # nothing started
    return lines[0]


def fails_writing_nothing(tmp_path, n, *overrides, config=QUICKSTART):
    """:func:`fails` into ``tmp_path / "run"``, which must not exist afterwards (issue 22: a
    refused run writes nothing, also when only a rank other than the statistics server —
    which checks and creates ``run.out_dir`` — finds the input bad)."""
    line = fails(tmp_path / "run", n, *overrides, config=config)
    assert not (tmp_path / "run").exists(), line
    return line


@pytest.mark.parametrize(
    "n, overrides, expected",
    [
        (4, ["protocol.bogus=1"], "unknown config key protocol.bogus"),
        (4, ["optim.lr=fast"], "optim.lr = 'fast': expected a finite number"),
        (4, ["protocol.name=sometimes"], "expected one of hardsync, softsync, async"),
        (3, [], "world size 3 does not fit"),
        (6, ["cluster.learners=4"], "run with mpiexec -n 7"),
        (5, ["protocol.name=softsync", "protocol.n=3"], "protocol.n = 3 exceeds the 2 learners"),
        (4, ["data.source=hdf5", "data.path=/no/such/file.h5"], "/no/such/file.h5"),
    ],
    ids=[
        "bad-key",
        "bad-type",
        "bad-choice",
        "too-few-ranks",
        "learners-mismatch",
        "n>lambda",
        "missing-file",
    ],
)
def test_bad_input_one_clear_message(tmp_path, n, overrides, expected):
    assert expected in fails_writing_nothing(tmp_path, n, *overrides)


def test_gpu_without_cupy_is_refused_writing_nothing(tmp_path):
    """Only the learners and shards select the device: the statistics server had created the
    run directory before their refusal reached it (issue 22's last two unclean inputs)."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: run.device = gpu is not bad input")
    assert "needs CuPy" in fails_writing_nothing(tmp_path, 7, "run.device=gpu")


def test_malformed_dataset_and_missing_config(tmp_path):
    bad = tmp_path / "data.h5"
    bad.write_text("not hdf5 at all")
    msg = fails(tmp_path / "run", 4, "data.source=hdf5", f"data.path={bad}")
    assert str(bad) in msg and "HDF5" in msg
    msg = fails(tmp_path / "run", 4, config=tmp_path / "nope.toml")
    assert "does not exist" in msg


def test_thread_mode_without_thread_multiple_is_refused(tmp_path, monkeypatch):
    # mpi4py asks MPI_Init_thread for this level; MPICH then provides exactly it.
    monkeypatch.setenv("MPI4PY_RC_THREAD_LEVEL", "serialized")
    line = fails(tmp_path, 5, "comm.mode=thread")
    assert "needs MPI_THREAD_MULTIPLE" in line and "provides MPI_THREAD_SERIALIZED" in line
    # one thread at a time calls MPI in the other modes (minibatches are then fetched inline)
    train(tmp_path / "ok", 5, "comm.mode=nonblocking", "run.epochs=1")


def test_existing_dump_is_not_overwritten(tmp_path):
    train(tmp_path, 4, "run.epochs=1")
    before = (tmp_path / "stats.h5").read_bytes()
    res = run_job(4, [str(QUICKSTART), f"run.out_dir={tmp_path}", "run.epochs=1"], timeout=60)
    assert res.returncode != 0 and "run.overwrite=true" in res.stderr
    assert (tmp_path / "stats.h5").read_bytes() == before


@pytest.mark.parametrize(
    "mode", ["comm.mode=blocking", "comm.mode=nonblocking", "comm.mode=thread"]
)
def test_exception_on_one_rank_aborts_the_job_naming_rank_and_host(tmp_path, mode):
    res = run_job(
        7,
        [
            str(QUICKSTART),
            f"run.out_dir={tmp_path}",
            "inject.fail_learner=1",
            "inject.fail_step=3",
            mode,
        ],
        timeout=60,
    )
    assert res.returncode != 0
    assert f"rank 4 (learner 1) on {socket.gethostname()} failed" in res.stderr
    assert "failure injected at step 3" in res.stderr


def test_stall_report_names_what_a_rank_waits_for(tmp_path):
    res = train(tmp_path, 5, "run.epochs=1", "inject.compute_time=0.05", "comm.stall_timeout=0.01")
    assert "stalled" in res.stderr and "waiting for a push or pull from learners" in res.stderr
    assert "last received: rank" in res.stderr


def test_oversubscribed_ten_ranks_finish_and_every_learner_works(tmp_path):
    train(tmp_path, 10, "protocol.name=async", "run.epochs=3", timeout=180)
    dump = load_dump(tmp_path / "stats.h5")
    learners = dump.group("learners")
    assert sorted(learners["learner"].tolist()) == list(range(7))
    assert np.all(learners["minibatches"] > 0)
    assert dump.attrs["finished"]


def test_unusable_out_dir_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    line = fails(blocker / "run", 4)  # before: a traceback from the stats server, mid-run
    assert "run.out_dir" in line and "a part of the path is a file" in line


def test_fault_aimed_at_no_learner_is_refused(tmp_path):
    line = fails(tmp_path / "run", 7, "inject.fail_learner=99")  # before: ignored, exit 0
    assert "inject.fail_learner = 99: expected -1 (none) or one of learners 0..3" in line


def test_diverging_run_stops_with_one_line_naming_rank_and_step(tmp_path):
    res = run_job(
        5, [str(QUICKSTART), f"run.out_dir={tmp_path}", "optim.lr=1e30", "run.epochs=2"],
        timeout=60,
    )
    assert res.returncode != 0, res.output  # before: NaN weights, exit 0, no warning
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: rank")]
    assert lines and re.match(r"pserver-run: rank \d \(learner \d\) on \S+: ", lines[0]), res.output
    assert "the training loss became nan at step" in lines[0] and "smaller optim.lr" in lines[0]
    assert "Traceback" not in res.stderr
